//! The dashboard's server half against a real store (the embedded SQLite
//! one, with a workspace directory): every page's data, sign-in, the
//! refusals of every action (no sign-in, wrong role, bad CSRF, unknown or
//! unreachable replica), hostile ids shown as text, live updates, the
//! bundle and the file downloads. Drain and takeover against running
//! sidecars are in the browser tests (`tests/tests/dashboard_browser.rs`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use baton_session::*;
use baton_store_sqlite::SqliteStore;
use baton_web::server::{Audit, Auth, Dashboard, Sidecars};
use baton_workspace::{Manifest, WorkspaceStore};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

const VIEWER: &str = "viewer-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";

struct Fixture {
    _dir: tempfile::TempDir,
    store: SqliteStore,
    workspaces: WorkspaceStore,
    router: axum::Router,
    dashboard: Arc<Dashboard>,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("baton.db"))
        .await
        .unwrap();
    let workspaces = WorkspaceStore::local(&dir.path().join("objects")).unwrap();
    let tokens = format!(
        "- {{name: vic, role: viewer, token: {VIEWER}}}\n- {{name: ops, role: operator, token: {OPERATOR}}}"
    );
    let dashboard = Arc::new(Dashboard::new(
        Arc::new(store.clone()),
        Some(workspaces.clone()),
        Sidecars::new(
            None,
            baton_web::server::Vouch::networks("127.0.0.1").unwrap(),
        ),
        Auth::from_yaml(std::path::Path::new("tokens.yaml"), &tokens).unwrap(),
        Audit::in_memory(),
    ));
    Fixture {
        router: baton_web::server::router(dashboard.clone()),
        _dir: dir,
        store,
        workspaces,
        dashboard,
    }
}

/// Commits `turns` turns on `replica`; the last one with `files` in its
/// workspace when given.
async fn commit_turns(
    f: &Fixture,
    tenant: &str,
    session: &str,
    replica: &str,
    turns: u64,
    files: &[(&str, &str)],
) {
    let key = SessionKey::new(tenant, session).unwrap();
    let replica = ReplicaId::new(replica).unwrap();
    f.store
        .heartbeat(&replica, Duration::from_secs(60))
        .await
        .unwrap();
    for i in 0..turns {
        let begin = BeginRequest {
            key: key.clone(),
            replica: replica.clone(),
            turn_seq: None,
            cached_version: None,
            lease_ttl: Duration::from_secs(30),
            state_ttl: Duration::from_secs(3600),
            reclaim_own_lease: false,
            input_digest: None,
        };
        let BeginOutcome::Granted { lease, .. } = f.store.begin(&begin).await.unwrap() else {
            panic!("not granted");
        };
        let workspace = if i + 1 == turns && !files.is_empty() {
            let dir = tempfile::tempdir().unwrap();
            for (name, text) in files {
                std::fs::write(dir.path().join(name), text).unwrap();
            }
            f.workspaces
                .snapshot(
                    dir.path(),
                    &Manifest::default(),
                    &key,
                    lease.version + 1,
                    lease.fence,
                )
                .await
                .unwrap()
        } else {
            None
        };
        let commit = CommitRequest {
            expected_version: lease.version,
            lease,
            payload: Bytes::from(format!("{{\"said\":\"turn {i} of {session}\"}}")),
            workspace,
            reply: Bytes::from_static(b"ok"),
            state_ttl: Duration::from_secs(3600),
            started_at_ms: 1,
            input_digest: "in".into(),
            // What was said, hostile and, for the first turn, long.
            input: Some(format!(
                "hello <b>{i}</b>{}",
                " and so on".repeat(if i == 0 { 40 } else { 0 })
            )),
        };
        assert!(matches!(
            f.store.commit(&commit).await.unwrap(),
            CommitOutcome::Committed { .. }
        ));
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn send(router: &axum::Router, request: Request<Body>) -> Answer {
    let what = format!("{} {}", request.method(), request.uri());
    // A page that never finishes fails here, naming itself, instead of
    // holding the test binary until an outer limit.
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, body)
    })
    .await;
    let Ok((status, headers, body)) = answer else {
        panic!("{what}: no whole answer within 30 s");
    };
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The cookie of a sign-in with `token`.
async fn sign_in(router: &axum::Router, token: &str) -> String {
    let answer = send(
        router,
        Request::post("/dashboard/signin")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!("token={token}")))
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    assert_eq!(answer.headers[header::LOCATION], "/dashboard");
    let cookie = answer.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    cookie.split(';').next().unwrap().to_owned()
}

async fn get(router: &axum::Router, cookie: &str, uri: &str) -> Answer {
    send(
        router,
        Request::get(uri)
            .header(header::COOKIE, cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

async fn post_form(router: &axum::Router, cookie: &str, uri: &str, form: &str) -> Answer {
    send(
        router,
        Request::post(uri)
            .header(header::COOKIE, cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form.to_owned()))
            .unwrap(),
    )
    .await
}

/// The CSRF token in a page's action form.
fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    html[at..at + 64].to_owned()
}

#[tokio::test]
async fn pages_need_a_sign_in_and_a_known_token() {
    let f = fixture().await;
    let answer = get(&f.router, "", "/dashboard").await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    assert_eq!(answer.headers[header::LOCATION], "/dashboard/signin");
    let answer = get(&f.router, "baton_dashboard=forged", "/dashboard/replicas").await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    for (uri, method) in [
        ("/dashboard/live/sessions", "GET"),
        ("/dashboard/api/load_sessions", "POST"),
        ("/dashboard/actions/drain", "POST"),
    ] {
        let answer = send(
            &f.router,
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert!(answer.body.contains("UNAUTHENTICATED"), "{}", answer.body);
    }
    let page = get(&f.router, "", "/dashboard/signin").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("name=\"token\""), "{}", page.body);
    let wrong = send(
        &f.router,
        Request::post("/dashboard/signin")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("token=not-a-dashboard-token"))
            .unwrap(),
    )
    .await;
    assert_eq!(
        wrong.headers[header::LOCATION],
        "/dashboard/signin?failed=1"
    );
    assert!(wrong.headers.get(header::SET_COOKIE).is_none());

    let cookie = sign_in(&f.router, VIEWER).await;
    let page = get(&f.router, &cookie, "/dashboard").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("id=\"viewer\">vic<!> (<!>viewer"),
        "{}",
        page.body
    );
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert_eq!(page.headers[header::CACHE_CONTROL], "no-store");
    // Signing out ends it.
    let out = post_form(&f.router, &cookie, "/dashboard/signout", "").await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(
        get(&f.router, &cookie, "/dashboard").await.status,
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn the_sessions_page_lists_filters_pages_and_escapes() {
    let f = fixture().await;
    commit_turns(&f, "acme", "alpha", "replica-0-aaaaaa", 3, &[]).await;
    commit_turns(
        &f,
        "acme",
        "<script>alert(1)</script>",
        "replica-0-aaaaaa",
        1,
        &[],
    )
    .await;
    commit_turns(&f, "globex", "beta", "replica-1-bbbbbb", 2, &[]).await;
    let cookie = sign_in(&f.router, VIEWER).await;

    let html = get(&f.router, &cookie, "/dashboard").await.body;
    assert!(html.contains("<table id=\"sessions\">"), "{html}");
    for text in [
        "alpha",
        "beta",
        "acme",
        "globex",
        "replica-1-bbbbbb",
        "free",
    ] {
        assert!(html.contains(text), "{text} missing: {html}");
    }
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(!html.contains("<script>alert(1)"), "{html}");
    assert!(
        html.contains(r#"<a href="/dashboard/sessions/acme/alpha">alpha</a></td><td class="version num">3</td>"#),
        "{html}"
    );

    let only = |html: &str, yes: &str, no: &str| {
        assert!(
            html.contains(yes) && !html.contains(no),
            "{yes} / {no}: {html}"
        )
    };
    only(
        &get(&f.router, &cookie, "/dashboard?tenant=globex")
            .await
            .body,
        ">beta<",
        ">alpha<",
    );
    only(
        &get(&f.router, &cookie, "/dashboard?tenant=acme&prefix=al")
            .await
            .body,
        ">alpha<",
        "alert",
    );
    only(
        &get(&f.router, &cookie, "/dashboard?replica=replica-1")
            .await
            .body,
        ">beta<",
        ">alpha<",
    );
    let html = get(&f.router, &cookie, "/dashboard?tenant=nobody")
        .await
        .body;
    assert!(html.contains("No sessions."), "{html}");
    // Nothing is leased now.
    let html = get(&f.router, &cookie, "/dashboard?leased=1").await.body;
    assert!(html.contains("No sessions."), "{html}");

    // A tenant no id can be: refused on the page, naming the field.
    let html = get(&f.router, &cookie, "/dashboard?tenant=%01").await.body;
    assert!(
        html.contains("class=\"error\"") && html.contains("tenant:"),
        "{html}"
    );
}

#[tokio::test]
async fn pages_of_sessions_follow_each_other() {
    let f = fixture().await;
    for i in 0..105 {
        commit_turns(&f, "acme", &format!("s-{i:03}"), "replica-0-aaaaaa", 1, &[]).await;
    }
    let cookie = sign_in(&f.router, VIEWER).await;
    let first = get(&f.router, &cookie, "/dashboard?tenant=acme").await.body;
    assert_eq!(first.matches("class=\"session\"").count(), 100);
    let marker = "id=\"next-page\" href=\"";
    let at = first.find(marker).expect("a next page") + marker.len();
    let next = first[at..].split('"').next().unwrap().replace("&amp;", "&");
    assert!(next.contains("after_session=s%2D099"), "{next}");
    let second = get(&f.router, &cookie, &next).await.body;
    assert_eq!(second.matches("class=\"session\"").count(), 5, "{second}");
    assert!(
        second.contains(">s-100<") && !second.contains("next-page"),
        "{second}"
    );
}

#[tokio::test]
async fn the_session_page_shows_turns_files_and_the_state_on_request() {
    let f = fixture().await;
    commit_turns(&f, "acme", "s-1", "replica-0-aaaaaa", 2, &[]).await;
    commit_turns(
        &f,
        "acme",
        "s-1",
        "replica-1-bbbbbb",
        1,
        &[("notes.md", "# Notes\n<b>Lin</b> likes tea\n")],
    )
    .await;
    let cookie = sign_in(&f.router, VIEWER).await;
    let html = get(&f.router, &cookie, "/dashboard/sessions/acme/s-1")
        .await
        .body;
    assert!(html.contains(r#"<td id="version">3</td>"#), "{html}");
    let seqs: Vec<usize> = (1..=3)
        .map(|i| html.find(&format!("data-seq=\"{i}\"")).expect("each turn"))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "oldest first: {html}");
    assert!(
        html.contains("replica-1-bbbbbb") && html.contains("id=\"timeline\""),
        "{html}"
    );
    assert!(html.contains("data-name=\"notes.md\""), "{html}");
    // What was said, escaped; a long input folded behind its start.
    assert!(
        html.contains("hello &lt;b&gt;1&lt;/b&gt;") && !html.contains("hello <b>"),
        "{html}"
    );
    assert!(html.contains(r#"<details class="said folded">"#), "{html}");
    assert!(html.contains("class=\"said-out\""), "{html}");
    assert!(html.contains("&lt;b&gt;Lin&lt;/b&gt; likes tea"), "{html}");
    // The state only when revealed; a viewer gets no takeover.
    assert!(
        !html.contains("turn 0 of s-1") && html.contains("id=\"reveal-state\""),
        "{html}"
    );
    assert!(!html.contains("id=\"takeover\""), "{html}");
    let html = get(
        &f.router,
        &cookie,
        "/dashboard/sessions/acme/s-1?reveal=state",
    )
    .await
    .body;
    assert!(html.contains("turn 0 of s-1"), "{html}");

    // The file, to view and to download, never to run.
    let file = get(&f.router, &cookie, "/dashboard/files/acme/s-1/notes.md").await;
    assert_eq!(file.status, StatusCode::OK);
    assert_eq!(file.body, "# Notes\n<b>Lin</b> likes tea\n");
    assert_eq!(
        file.headers[header::CONTENT_TYPE],
        "text/plain; charset=utf-8"
    );
    assert_eq!(file.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert!(
        file.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("sandbox")
    );
    let download = get(
        &f.router,
        &cookie,
        "/dashboard/files/acme/s-1/notes.md?download=true",
    )
    .await;
    assert!(
        download.headers[header::CONTENT_DISPOSITION]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    let missing = get(&f.router, &cookie, "/dashboard/files/acme/s-1/other.md").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains("other.md"), "{}", missing.body);

    let html = get(&f.router, &cookie, "/dashboard/sessions/acme/never")
        .await
        .body;
    assert!(html.contains("id=\"no-state\""), "{html}");
    // An operator sees the takeover.
    let ops = sign_in(&f.router, OPERATOR).await;
    let html = get(&f.router, &ops, "/dashboard/sessions/acme/s-1")
        .await
        .body;
    assert!(html.contains("id=\"takeover\""), "{html}");
}

#[tokio::test]
async fn actions_are_refused_with_the_rule_and_audited() {
    let f = fixture().await;
    commit_turns(&f, "acme", "s-1", "replica-0-aaaaaa", 1, &[]).await;
    // A replica that says where it is, but nobody answers there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    f.store
        .heartbeat_with(
            &ReplicaId::new("replica-1-cccccc").unwrap(),
            ReplicaInfo {
                replica: "replica-1".into(),
                url: Some(format!("http://127.0.0.1:{port}")),
                ..ReplicaInfo::default()
            },
            Duration::from_secs(60),
        )
        .await
        .unwrap();

    // A viewer can neither see nor forge an action.
    let viewer = sign_in(&f.router, VIEWER).await;
    let html = get(&f.router, &viewer, "/dashboard/replicas").await.body;
    assert!(
        html.contains("data-replica=\"replica-1\"") && !html.contains("Drain…"),
        "{html}"
    );
    let page = get(
        &f.router,
        &viewer,
        "/dashboard/confirm?action=drain&replica=replica-1",
    )
    .await
    .body;
    assert!(
        page.contains("id=\"forbidden\"") && !page.contains("name=\"csrf\""),
        "{page}"
    );
    let forged = post_form(
        &f.router,
        &viewer,
        "/dashboard/actions/drain",
        "replica=replica-1&csrf=x",
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(forged.body.contains("operator role"), "{}", forged.body);

    // An operator without the form's token is refused too.
    let ops = sign_in(&f.router, OPERATOR).await;
    for form in ["replica=replica-1", "replica=replica-1&csrf=0000"] {
        let answer = post_form(&f.router, &ops, "/dashboard/actions/drain", form).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{form}");
        assert!(answer.body.contains("csrf"), "{}", answer.body);
    }
    let confirm = get(
        &f.router,
        &ops,
        "/dashboard/confirm?action=drain&replica=replica-1",
    )
    .await
    .body;
    let csrf = csrf_of(&confirm);
    // Another sign-in's token is not this one's.
    let other = sign_in(&f.router, OPERATOR).await;
    let answer = post_form(
        &f.router,
        &other,
        "/dashboard/actions/drain",
        &format!("replica=replica-1&csrf={csrf}"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    // Each refusal is audited: who tried, and why not.
    let refusals = f.dashboard.audit.entries();
    assert_eq!(refusals.len(), 4, "{refusals:?}");
    assert!(
        refusals
            .iter()
            .all(|e| !e.ok && e.detail.starts_with("refused: ") && e.action == "drain"),
        "{refusals:?}"
    );
    assert!(refusals[3].detail.contains("operator role"), "{refusals:?}");
    assert_eq!(refusals[0].who, "ops", "{refusals:?}");

    // With it, each failure is audited with its reason.
    let cases = [
        (
            "/dashboard/actions/drain",
            "replica=replica-9".to_owned(),
            "no live replica is named \"replica-9\"",
        ),
        (
            "/dashboard/actions/drain",
            "replica=replica-0-aaaaaa".to_owned(),
            "does not advertise its address",
        ),
        (
            "/dashboard/actions/drain",
            "replica=replica-1".to_owned(),
            "replica-1 did not answer",
        ),
        (
            "/dashboard/actions/takeover",
            "tenant=acme&session=s-1".to_owned(),
            "replica-1 did not answer",
        ),
        (
            "/dashboard/actions/takeover",
            "tenant=%01&session=s-1".to_owned(),
            "tenant",
        ),
        (
            "/dashboard/actions/interrupt",
            "tenant=acme&session=s-1&turn=2".to_owned(),
            "replica-1 did not answer",
        ),
        (
            "/dashboard/actions/interrupt",
            "tenant=acme&session=s-1&turn=0".to_owned(),
            "turn: \"0\" is not a turn number",
        ),
        (
            "/dashboard/actions/interrupt",
            format!("tenant=acme&session=s-1&turn={}", "9".repeat(5000)),
            "is not a turn number",
        ),
    ];
    for (i, (uri, form, reason)) in cases.iter().enumerate() {
        let answer = post_form(&f.router, &ops, uri, &format!("{form}&csrf={csrf}")).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{uri} {form}");
        let location = answer.headers[header::LOCATION]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            location.ends_with(&format!("?done={}", i + 1 + refusals.len())),
            "{location}"
        );
        let entry = &f.dashboard.audit.entries()[0];
        assert!(
            !entry.ok && entry.detail.contains(reason),
            "{form}: {entry:?}"
        );
        assert_eq!(entry.who, "ops");
        // The page it goes back to says how it ended.
        let html = get(&f.router, &ops, &location).await.body;
        assert!(
            html.contains("id=\"done\"") && html.contains("failed"),
            "{html}"
        );
    }
    let html = get(&f.router, &viewer, "/dashboard/audit").await.body;
    assert_eq!(
        html.matches("class=\"entry\"").count(),
        cases.len() + refusals.len(),
        "{html}"
    );
    // Nothing reaches a page that names a store or a secret.
    assert!(
        !html.contains("sqlite") && !html.contains(OPERATOR),
        "{html}"
    );
}

/// The first event of a live channel, as JSON.
async fn first_event<T: serde::de::DeserializeOwned>(
    router: &axum::Router,
    cookie: &str,
    uri: &str,
) -> T {
    let response = router
        .clone()
        .oneshot(
            Request::get(uri)
                .header(header::COOKIE, cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{uri}");
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body();
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let json = seen.strip_prefix("data: ").unwrap_or(&seen).trim();
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{uri}: {e}: {seen}"))
}

#[tokio::test]
async fn a_running_turn_shows_its_words_and_an_operator_its_stop() {
    use baton_session::turn_stream::{EventKind, StreamEvent, TurnStreams};
    let f = fixture().await;
    commit_turns(&f, "acme", "talk", "replica-0-aaaaaa", 1, &[]).await;
    let key = SessionKey::new("acme", "talk").unwrap();
    let replica = ReplicaId::new("replica-1-bbbbbb").unwrap();
    let BeginOutcome::Granted { lease, .. } = f
        .store
        .begin(&BeginRequest {
            key: key.clone(),
            replica: replica.clone(),
            turn_seq: None,
            cached_version: None,
            lease_ttl: Duration::from_secs(30),
            state_ttl: Duration::from_secs(3600),
            reclaim_own_lease: false,
            input_digest: None,
        })
        .await
        .unwrap()
    else {
        panic!("not granted");
    };
    // The running turn has kept no stream: the page says so, and asks its
    // replica (at its next lease check) to keep one.
    let ops = sign_in(&f.router, OPERATOR).await;
    let html = get(&f.router, &ops, "/dashboard/sessions/acme/talk")
        .await
        .body;
    assert!(html.contains("id=\"live-output-none\""), "{html}");
    assert_eq!(
        f.store.check_lease(&lease).await.unwrap(),
        LeaseCheck::Followed,
        "the page asked for the stream"
    );
    let event = |kind, attempt, n, data: &str| StreamEvent {
        kind,
        attempt,
        n,
        data: data.into(),
    };
    // An older attempt's words, then the running one's: only the running
    // attempt's show, as text.
    let older = lease.fence - 1;
    assert!(
        f.store
            .append_events(
                &key,
                lease.turn_seq,
                &[
                    event(EventKind::Turn, older, 0, "{}"),
                    event(EventKind::Delta, older, 1, r#"{"text":"VOIDED "}"#),
                ],
            )
            .await
            .unwrap()
    );
    assert!(
        f.store
            .append_events(
                &key,
                lease.turn_seq,
                &[
                    event(EventKind::Turn, lease.fence, 0, "{}"),
                    event(
                        EventKind::Progress,
                        lease.fence,
                        1,
                        r#"{"name":"looking it up"}"#
                    ),
                    event(
                        EventKind::Delta,
                        lease.fence,
                        2,
                        r#"{"text":"Hello <b>there</b>, "}"#
                    ),
                    event(EventKind::Delta, lease.fence, 3, r#"{"text":"so far"}"#),
                ],
            )
            .await
            .unwrap()
    );
    let ops = sign_in(&f.router, OPERATOR).await;
    let viewer = sign_in(&f.router, VIEWER).await;
    let html = get(&f.router, &ops, "/dashboard/sessions/acme/talk")
        .await
        .body;
    assert!(html.contains("id=\"running-turn\""), "{html}");
    assert!(
        html.contains("Hello &lt;b&gt;there&lt;/b&gt;, <!-- -->so far")
            || html.contains("Hello &lt;b&gt;there&lt;/b&gt;, so far"),
        "{html}"
    );
    assert!(
        !html.contains("VOIDED") && !html.contains("<b>there"),
        "{html}"
    );
    assert!(html.contains("looking it up"), "{html}");
    assert!(html.contains("1 earlier attempt(s)"), "{html}");
    let stop = format!(
        "/dashboard/confirm?action=interrupt&amp;tenant=acme&amp;session=talk&amp;turn={}",
        lease.turn_seq
    );
    assert!(html.contains(&stop), "{html}");
    let as_viewer = get(&f.router, &viewer, "/dashboard/sessions/acme/talk")
        .await
        .body;
    assert!(as_viewer.contains("id=\"running-turn\""), "{as_viewer}");
    assert!(
        !as_viewer.contains("id=\"stop\""),
        "a viewer gets no Stop: {as_viewer}"
    );

    // The fast channel carries the words alone.
    let fast: baton_web::model::OutputData = first_event(
        &f.router,
        &viewer,
        "/dashboard/live/sessions/acme/talk/output",
    )
    .await;
    let output = fast.output.expect("a running turn");
    assert_eq!(output.text, "Hello <b>there</b>, so far");
    assert_eq!(
        (output.turn_seq, output.attempt),
        (lease.turn_seq, lease.fence)
    );
    assert_eq!(output.owner, replica.to_string());

    // The confirmation names the turn and carries the form.
    let confirm = get(
        &f.router,
        &ops,
        &format!(
            "/dashboard/confirm?action=interrupt&tenant=acme&session=talk&turn={}",
            lease.turn_seq
        ),
    )
    .await
    .body;
    assert!(
        confirm.contains("action=\"/dashboard/actions/interrupt\""),
        "{confirm}"
    );
    assert!(confirm.contains("name=\"turn\" value=\"2\""), "{confirm}");

    // Once the turn is over, nothing runs and the section goes.
    f.store.revoke(&key).await.unwrap();
    let html = get(&f.router, &ops, "/dashboard/sessions/acme/talk")
        .await
        .body;
    assert!(!html.contains("id=\"running-turn\""), "{html}");
    let fast: baton_web::model::OutputData = first_event(
        &f.router,
        &viewer,
        "/dashboard/live/sessions/acme/talk/output",
    )
    .await;
    assert_eq!(fast.output, None);
}

#[tokio::test]
async fn live_updates_stream_the_page_data() {
    let f = fixture().await;
    commit_turns(&f, "acme", "live-1", "replica-0-aaaaaa", 1, &[]).await;
    let cookie = sign_in(&f.router, VIEWER).await;
    let data: baton_web::model::SessionsData =
        first_event(&f.router, &cookie, "/dashboard/live/sessions?tenant=acme").await;
    assert_eq!(data.rows.len(), 1);
    assert_eq!(data.rows[0].summary.session, "live-1");
}

#[tokio::test]
async fn the_bundle_is_served_gzipped_without_a_sign_in() {
    let f = fixture().await;
    if !baton_web::server::assets::HYDRATES {
        eprintln!("built with BATON_WEB_SKIP_WASM=1: no bundle to check");
        return;
    }
    let wasm = send(
        &f.router,
        Request::get("/dashboard/pkg/baton-web_bg.wasm")
            .header(header::ACCEPT_ENCODING, "gzip, br")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(wasm.status, StatusCode::OK);
    assert_eq!(wasm.headers[header::CONTENT_TYPE], "application/wasm");
    assert_eq!(wasm.headers[header::CONTENT_ENCODING], "gzip");
    let cookie = sign_in(&f.router, VIEWER).await;
    let html = get(&f.router, &cookie, "/dashboard").await.body;
    assert!(html.contains("/dashboard/pkg/baton-web.js"), "{html}");
    let js = get(&f.router, "", "/dashboard/pkg/baton-web.js").await;
    assert!(js.body.contains("hydrate"), "the glue exports hydrate");
    assert_eq!(
        get(&f.router, "", "/dashboard/pkg/other.js").await.status,
        StatusCode::NOT_FOUND
    );
}
