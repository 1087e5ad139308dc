//! The sidecar's HTTP API against hostile and broken input, authentication,
//! agent failures and drain — one live sidecar + reference agent process.

use baton_e2e::support;

use serde_json::{Value, json};
use support::{Replica, serial};

const TOKEN_ACME: &str = "acme-token-0123456789";
const TOKEN_GLOBEX: &str = "globex-token-0123456789";
const TOKEN_ADMIN: &str = "admin-token-0123456789";

async fn send(req: reqwest::RequestBuilder) -> (u16, Value, reqwest::header::HeaderMap) {
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.json().await.unwrap_or(Value::Null), headers)
}

/// One turn with `input` at `turns` (a session's turns URL): the answer's
/// status and body.
async fn turn(http: &reqwest::Client, turns: &str, input: &str) -> (u16, Value) {
    let (status, body, _) = send(http.post(turns).json(&json!({ "input": input }))).await;
    (status, body)
}

/// A turn with `input` at `turns` that must answer `status` with the
/// outcome `outcome`; its body.
async fn expect_outcome(
    http: &reqwest::Client,
    turns: &str,
    input: &str,
    status: u16,
    outcome: &str,
) -> Value {
    let (got, body) = turn(http, turns, input).await;
    assert_eq!(
        (got, body["status"].as_str()),
        (status, Some(outcome)),
        "{input}: {body}"
    );
    body
}

/// Sends a POST head announcing `length` bytes, no body, and returns the answer.
async fn head_only(base: &str, path: &str, length: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer is small; read until the server closes or sends a full JSON body.
    while let Ok(Ok(n)) =
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut buf)).await
    {
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        if answer.ends_with(b"}") {
            break;
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends a turn from its own task; its answer comes with the handle.
fn in_background(
    http: &reqwest::Client,
    url: String,
    input: &'static str,
) -> tokio::task::JoinHandle<(u16, Value, reqwest::header::HeaderMap)> {
    let http = http.clone();
    tokio::spawn(async move { send(http.post(url).json(&json!({ "input": input }))).await })
}

/// Waits until the replica reports exactly one turn running.
async fn one_turn_in_flight(http: &reqwest::Client, replica: &Replica) {
    one_turn_in_flight_at(http, &replica.url, None).await
}

/// [`one_turn_in_flight`] for the sidecar at `base`, with an admin token.
async fn one_turn_in_flight_at(http: &reqwest::Client, base: &str, token: Option<&str>) {
    baton_testkit::poll_async(
        std::time::Duration::from_secs(10),
        "the turn to run",
        || async {
            let mut status = http.get(format!("{base}/v1/admin/status"));
            if let Some(token) = token {
                status = status.bearer_auth(token);
            }
            let (_, s, _) = send(status).await;
            (s["inFlight"] == 1).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_documented_4xx_and_loses_nothing() {
    let _one = serial().await;
    let replica = Replica::start(&[]).await;
    let http = reqwest::Client::new();
    let turns = |session: &str| format!("{}/v1/sessions/{session}/turns", replica.url);
    let (status, ok, _) = send(
        http.post(turns("s-1"))
            .json(&json!({ "input": "my name is Lin" })),
    )
    .await;
    assert_eq!(status, 200, "{ok}");

    let raw = |body: &'static str| {
        http.post(turns("s-1"))
            .header("content-type", "application/json")
            .body(body)
    };
    let (status, body, headers) = send(raw(r#"{"input": "unterminated"#)).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("not valid JSON"),
        "{body}"
    );
    assert_eq!(headers["x-baton-outcome"], "BAD_REQUEST");

    let (status, body, _) = send(raw(r#"{"input": 42}"#)).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "input");
    let (status, body, _) = send(raw(r#"{"input": "x", "turnSeq": "three"}"#)).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("turnSeq")),
        "{body}"
    );
    let (status, body, _) = send(raw(r#"{"input": "x", "sudo": true}"#)).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("sudo"), "{body}");
    let (status, body, _) = send(raw(r#"{"input": "   "}"#)).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("input")),
        "{body}"
    );
    let (status, body, _) = send(raw(r#"{"input": "x", "turnSeq": 0}"#)).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("turnSeq")),
        "{body}"
    );

    // A 10 MB body is refused from its Content-Length, before a byte of it
    // is read: a raw client sends only the head and gets the answer.
    let answer = head_only(&replica.url, "/v1/sessions/s-1/turns", 10 * 1024 * 1024).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("TOO_LARGE"), "{answer}");
    // An input over its own limit (256 KiB) inside an acceptable body.
    let long = json!({ "input": "a".repeat(300 * 1024) });
    let (status, body, _) = send(http.post(turns("s-1")).json(&long)).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (413, Some("input")),
        "{body}"
    );

    // Session ids the runtime refuses (control characters, more than 256
    // bytes), percent-encoded so they reach the router intact. Braces,
    // colons, slashes and spaces are ids like any other (tests/tests/acceptance.rs).
    let long_id = "s".repeat(10 * 1024);
    for id in ["%00", "a%0Ab", "%7F", &"s".repeat(257), long_id.as_str()] {
        let (status, body, _) = send(http.post(turns(id)).json(&json!({ "input": "hi" }))).await;
        assert_eq!(status, 400, "session id {id:.20}: {body}");
        assert_eq!(body["field"], "session", "{body}");
    }
    // Through the body: control characters, nothing, too long.
    for id in ["a\nb", "", &"s".repeat(257)] {
        let (status, body, _) = send(
            http.post(format!("{}/api/chat", replica.url))
                .json(&json!({ "sessionId": id, "input": "hi" })),
        )
        .await;
        assert_eq!(
            (status, body["field"].as_str()),
            (400, Some("sessionId")),
            "{id:?}: {body}"
        );
    }
    let (status, body, _) = send(
        http.post(turns("s-1") + "?wait=forever")
            .json(&json!({ "input": "hi" })),
    )
    .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("wait")),
        "{body}"
    );
    let (status, body, _) = send(
        http.post(turns("s-1") + "?wait=2h")
            .json(&json!({ "input": "hi" })),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body, headers) = send(http.get(format!("{}/v1/nope", replica.url))).await;
    assert_eq!((status, body["status"].as_str()), (404, Some("NOT_FOUND")));
    assert_eq!(headers["x-baton-outcome"], "NOT_FOUND");
    // Every route asked with a method it does not serve: the same JSON shape.
    for (method, path) in [
        (reqwest::Method::GET, "/api/chat"),
        (reqwest::Method::GET, "/v1/sessions/s-1/turns"),
        (reqwest::Method::DELETE, "/v1/sessions/s-1"),
        (reqwest::Method::PUT, "/v1/sessions/s-1/files"),
        (reqwest::Method::POST, "/v1/sessions/s-1/files/notes.md"),
        (reqwest::Method::POST, "/healthz"),
        (reqwest::Method::POST, "/readyz"),
        (reqwest::Method::POST, "/metrics"),
        (reqwest::Method::GET, "/v1/admin/drain"),
        (reqwest::Method::POST, "/drained"),
        (reqwest::Method::POST, "/v1/admin/status"),
        (reqwest::Method::GET, "/v1/admin/handover"),
        (
            reqwest::Method::GET,
            "/v1/admin/tenants/default/sessions/s-1/takeover",
        ),
    ] {
        let (status, body, headers) =
            send(http.request(method.clone(), format!("{}{path}", replica.url))).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (405, Some("METHOD_NOT_ALLOWED")),
            "{method} {path}: {body}"
        );
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(path)),
            "{body}"
        );
        assert_eq!(headers["x-baton-outcome"], "METHOD_NOT_ALLOWED");
    }
    // axum's own refusals (a query or path it cannot read) too.
    for path in ["/v1/sessions/s-1?state=yes", "/v1/sessions/%FF%FE"] {
        let (status, body, headers) = send(http.get(format!("{}{path}", replica.url))).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (400, Some("BAD_REQUEST")),
            "{path}: {body}"
        );
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
        assert_eq!(headers["x-baton-outcome"], "BAD_REQUEST");
    }

    // Nothing that was committed was lost.
    let (status, body, _) = send(
        http.post(turns("s-1"))
            .json(&json!({ "input": "what is my name?" })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["reply"].as_str(), body["stateVersion"].as_u64()),
        (Some("Your name is Lin."), Some(2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_decide_the_tenant_and_unknown_ones_are_refused() {
    let _one = serial().await;
    let tokens = format!("--auth-tokens={TOKEN_ACME}=acme,{TOKEN_GLOBEX}=globex");
    let admins = format!("--admin-tokens={TOKEN_ADMIN}");
    let replica = Replica::start(&[&tokens, &admins]).await;
    let http = reqwest::Client::new();
    let turns = format!("{}/v1/sessions/s-1/turns", replica.url);
    expect_outcome(&http, &turns, "hi", 401, "UNAUTHORIZED").await;
    let (status, _, _) = send(
        http.post(&turns)
            .bearer_auth("not-a-known-token-at-all")
            .json(&json!({ "input": "hi" })),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _, _) = send(
        http.post(&turns)
            .bearer_auth(TOKEN_ACME)
            .json(&json!({ "input": "my name is Lin" })),
    )
    .await;
    assert_eq!(status, 200);
    // Same session id, other tenant: another session; the header cannot pick a tenant.
    let (status, body, _) = send(
        http.post(&turns)
            .bearer_auth(TOKEN_GLOBEX)
            .header("x-baton-tenant", "acme")
            .json(&json!({ "input": "what is my name?" })),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["reply"], "I don't know your name yet.");
    assert_eq!(body["stateVersion"], 1);
    let view = |token| {
        http.get(format!("{}/v1/sessions/s-1", replica.url))
            .bearer_auth(token)
    };
    let (_, acme, _) = send(view(TOKEN_ACME)).await;
    assert_eq!(
        (acme["tenant"].as_str(), acme["version"].as_u64()),
        (Some("acme"), Some(1))
    );
    let status_url = format!("{}/v1/admin/status", replica.url);
    let (status, _, _) = send(http.get(&status_url)).await;
    assert_eq!(status, 401, "the admin API needs a token too");
    let (status, body, _) = send(http.get(&status_url).bearer_auth(TOKEN_ACME)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (403, Some("FORBIDDEN")),
        "a tenant's token is not an admin token: {body}"
    );
    let (status, body, _) = send(http.get(&status_url).bearer_auth(TOKEN_ADMIN)).await;
    assert_eq!(
        (status, body["replica"].as_str()),
        (200, Some("solo")),
        "{body}"
    );
    // No address is trusted to drain without a token: see
    // `admin_tokens_alone_guard_the_rollout_calls_and_leave_turns_open`.
    // Takeover fences out a session's holder: admin only, the tenant in
    // the path. Neither a tenant (not even the session's own) nor a caller
    // without a token may; the admin may, for any tenant.
    let takeover = |tenant: &str, session: &str| {
        http.post(format!(
            "{}/v1/admin/tenants/{tenant}/sessions/{session}/takeover",
            replica.url
        ))
    };
    let (status, _, _) = send(takeover("acme", "s-1")).await;
    assert_eq!(status, 401, "takeover without a token");
    for token in [TOKEN_ACME, TOKEN_GLOBEX] {
        let (status, body, _) = send(takeover("acme", "s-1").bearer_auth(token)).await;
        assert_eq!(status, 403, "takeover with a tenant's token: {body}");
    }
    let (status, body, _) =
        send(takeover("acme", "s-1").bearer_auth("not-a-known-token-at-all")).await;
    assert_eq!(status, 401, "{body}");
    let (status, body, _) = send(takeover("acme", "s-1").bearer_auth(TOKEN_ADMIN)).await;
    assert_eq!(
        (status, body["tenant"].as_str(), body["session"].as_str()),
        (200, Some("acme"), Some("s-1")),
        "{body}"
    );
    let (status, body, _) = send(takeover("a%0Ab", "s-1").bearer_auth(TOKEN_ADMIN)).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("tenant")),
        "{body}"
    );
    // The old route, which took the tenant from the caller, is gone.
    let (status, _, _) = send(
        http.post(format!("{}/v1/admin/sessions/s-1/takeover", replica.url))
            .bearer_auth(TOKEN_ADMIN),
    )
    .await;
    assert_eq!(status, 404);
    // acme's session still answers, at its version: a takeover writes no state.
    let (_, acme, _) = send(view(TOKEN_ACME)).await;
    assert_eq!(acme["version"].as_u64(), Some(1), "{acme}");

    // Probes and metrics stay open for the kubelet and Prometheus.
    assert_eq!(
        http.get(format!("{}/readyz", replica.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{}/metrics", replica.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_agent_aborts_cleanly_and_metrics_count_outcomes() {
    let _one = serial().await;
    let replica = Replica::start(&["--agent-timeout=3s"]).await;
    let http = reqwest::Client::new();
    let turns = format!("{}/v1/sessions/s-1/turns", replica.url);
    let (status, _) = turn(&http, &turns, "/write a.txt kept").await;
    assert_eq!(status, 200);
    expect_outcome(&http, &turns, "/fail", 502, "AGENT_FAILED").await;
    expect_outcome(&http, &turns, "/sleep 6000", 504, "AGENT_TIMEOUT").await;
    // Nothing committed, lease released: the next turn runs at once, on version 1.
    let (status, body) = turn(&http, &turns, "still here").await;
    assert_eq!(
        (status, body["stateVersion"].as_u64()),
        (200, Some(2)),
        "{body}"
    );
    let text = http
        .get(format!("{}/v1/sessions/s-1/files/a.txt", replica.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "kept\n");

    let metrics = http
        .get(format!("{}/metrics", replica.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "baton_turns_total{outcome=\"ok\"} 2",
        "baton_turns_total{outcome=\"agent_failed\"} 1",
        "baton_turns_total{outcome=\"agent_timeout\"} 1",
        "baton_turns_in_flight 0",
        "baton_leases_held 0",
    ] {
        assert!(metrics.contains(line), "metrics lack {line:?}:\n{metrics}");
    }
    assert!(
        metrics.contains("baton_protocol_duration_seconds_bucket{le="),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_refuses_new_turns_and_finishes_running_ones() {
    let _one = serial().await;
    let replica = Replica::start(&["--drain-timeout=20s"]).await;
    let http = reqwest::Client::new();
    let running = {
        let url = format!("{}/v1/sessions/s-long/turns", replica.url);
        in_background(&http, url, "/sleep 4000")
    };
    one_turn_in_flight(&http, &replica).await;
    let (status, body, _) = send(http.post(format!("{}/v1/admin/drain", replica.url))).await;
    assert_eq!(
        (status, body["draining"].as_bool()),
        (202, Some(true)),
        "{body}"
    );
    assert_eq!(body["turns"][0]["session"], "s-long");
    assert_eq!(
        http.get(format!("{}/readyz", replica.url))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    let (status, body, headers) = send(
        http.post(format!("{}/v1/sessions/s-new/turns", replica.url))
            .json(&json!({ "input": "hi" })),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("DRAINING")),
        "{body}"
    );
    assert_eq!(headers["retry-after"], "1");
    // The running turn finishes and commits.
    let (status, body, _) = running.await.unwrap();
    assert_eq!(
        (status, body["stateVersion"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    let (status, body, _) =
        send(http.post(format!("{}/v1/admin/drain?wait=true", replica.url))).await;
    assert_eq!(
        (status, body["inFlight"].as_u64()),
        (200, Some(0)),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_does_not_strand_the_lease() {
    let _one = serial().await;
    let replica = Replica::start(&[]).await;
    let http = reqwest::Client::new();
    let turns = format!("{}/v1/sessions/s-gone/turns", replica.url);
    // The client gives up long before the turn ends.
    let gone = http
        .post(&turns)
        .timeout(std::time::Duration::from_millis(300))
        .json(&json!({ "input": "/sleep 1500" }))
        .send()
        .await;
    assert!(gone.is_err(), "the client timed out");
    // The turn still runs to its end and commits; the lease is released.
    let view = baton_testkit::poll_async(
        std::time::Duration::from_secs(10),
        "the abandoned turn to commit",
        || async {
            let (status, view, _) =
                send(http.get(format!("{}/v1/sessions/s-gone", replica.url))).await;
            (status == 200 && view["version"] == 1).then_some(view)
        },
    )
    .await;
    assert_eq!(view["lease"], Value::Null, "{view}");
    let (status, body) = turn(&http, &turns, "next").await;
    assert_eq!(
        (status, body["stateVersion"].as_u64()),
        (200, Some(2)),
        "{body}"
    );
    let metrics = http
        .get(format!("{}/metrics", replica.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("baton_leases_held 0"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_timeout_aborts_running_turns_and_frees_their_sessions() {
    let _one = serial().await;
    let replica = Replica::start(&["--drain-timeout=1s"]).await;
    let http = reqwest::Client::new();
    let long = {
        let url = format!("{}/v1/sessions/s-cut/turns", replica.url);
        in_background(&http, url, "/sleep 20000")
    };
    one_turn_in_flight(&http, &replica).await;
    let (status, body, _) =
        send(http.post(format!("{}/v1/admin/drain?wait=true", replica.url))).await;
    assert_eq!(
        (status, body["inFlight"].as_u64()),
        (200, Some(0)),
        "{body}"
    );
    let (status, body, headers) = long.await.unwrap();
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("ABORTED")),
        "{body}"
    );
    assert_eq!(
        headers["x-baton-outcome"], "ABORTED",
        "not DRAINING: the agent ran, so no proxy retries it blindly"
    );
    let (status, view, _) = send(http.get(format!("{}/v1/sessions/s-cut", replica.url))).await;
    // Nothing was committed and the lease was handed back.
    assert!(
        status == 404 || (view["version"] == 0 && view["lease"].is_null()),
        "{status} {view}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_agent_a_replica_is_not_ready_and_turns_may_retry() {
    let _one = serial().await;
    let closed = baton_testkit::free_port();
    let agent = format!("--agent-url=http://127.0.0.1:{closed}");
    let replica = Replica::start_until(&[&agent], "/healthz").await;
    let http = reqwest::Client::new();
    let (status, body, _) = send(http.get(format!("{}/readyz", replica.url))).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("AGENT_UNAVAILABLE")),
        "{body}"
    );
    let (status, body, headers) = send(
        http.post(format!("{}/v1/sessions/s-1/turns", replica.url))
            .json(&json!({ "input": "hi" })),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("AGENT_UNAVAILABLE")),
        "{body}"
    );
    assert_eq!(headers["retry-after"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_agent_call_cannot_write_into_later_turns() {
    let _one = serial().await;
    let replica = Replica::start(&["--agent-timeout=3s"]).await;
    let http = reqwest::Client::new();
    let turns = format!("{}/v1/sessions/s-z/turns", replica.url);
    let (status, _) = turn(&http, &turns, "first").await;
    assert_eq!(status, 200);
    // The sidecar gives up after 3 s; the agent goes on and writes its
    // notes at 6 s, into the directory it was given. (Not shorter: the
    // ordinary turns around it get the same timeout on a loaded machine.)
    expect_outcome(&http, &turns, "/sleep 6000", 504, "AGENT_TIMEOUT").await;
    let (status, _) = turn(&http, &turns, "second").await;
    assert_eq!(status, 200);
    let session_dir = replica.workspace().join("default/s-z");
    baton_testkit::poll_async(
        std::time::Duration::from_secs(10),
        "the abandoned call to write",
        || async {
            std::fs::read_dir(&session_dir)
                .ok()?
                .filter_map(Result::ok)
                .any(|e| {
                    std::fs::read_to_string(e.path().join("notes.md"))
                        .is_ok_and(|n| n.contains("/sleep 6000"))
                })
                .then_some(())
        },
    )
    .await;
    let (status, _) = turn(&http, &turns, "third").await;
    assert_eq!(status, 200);
    let notes = http
        .get(format!("{}/v1/sessions/s-z/files/notes.md", replica.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        notes.contains("first") && notes.contains("second") && notes.contains("third"),
        "{notes}"
    );
    assert!(
        !notes.contains("/sleep"),
        "the abandoned turn's late write leaked into a commit:\n{notes}"
    );
}

/// With two runtime threads, connections are spread over both, and the
/// threads still make one replica: one registry of running turns (so one
/// local turn per session and one status page), one drain, and a SIGTERM
/// that stops every thread once the running turns have committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_threads_share_one_replica_and_drain_together() {
    let _one = serial().await;
    let mut replica = Replica::start(&["--worker-threads=2", "--drain-timeout=20s"]).await;
    // Separate clients, so separate connections: the sidecar hands them to
    // its threads in turn.
    let (first, second, admin) = (
        reqwest::Client::new(),
        reqwest::Client::new(),
        reqwest::Client::new(),
    );
    let turns = |session: &str| format!("{}/v1/sessions/{session}/turns", replica.url);
    let long_a = in_background(&first, turns("s-a"), "/sleep 6000");
    let long_b = in_background(&second, turns("s-b"), "/sleep 6000");
    let status = baton_testkit::poll_async(
        std::time::Duration::from_secs(10),
        "both turns to run",
        || async {
            let (_, s, _) = send(admin.get(format!("{}/v1/admin/status", replica.url))).await;
            (s["inFlight"] == 2).then_some(s)
        },
    )
    .await;
    let sessions: Vec<_> = status["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["session"].as_str().unwrap())
        .collect();
    // The two connections are on different threads (handed out in turn),
    // and the status, served by either, lists both turns: one registry.
    // (With a registry per thread this fails: each lists its own turn.)
    assert_eq!(sessions, ["s-a", "s-b"], "{status}");
    // From the other thread, s-a is busy (the lease and the local slot
    // both say so).
    let (code, body, _) = send(second.post(turns("s-a")).json(&json!({ "input": "hi" }))).await;
    assert_eq!(
        (code, body["status"].as_str()),
        (409, Some("BUSY")),
        "{body}"
    );

    replica.terminate();
    for client in [&first, &second] {
        baton_testkit::poll_async(
            std::time::Duration::from_secs(5),
            "readiness to fail on every connection",
            || async {
                let r = client.get(format!("{}/readyz", replica.url)).send().await;
                (r.ok()?.status() == 503).then_some(())
            },
        )
        .await;
        let (code, body, _) =
            send(client.post(turns("s-new")).json(&json!({ "input": "hi" }))).await;
        assert_eq!(
            (code, body["status"].as_str()),
            (503, Some("DRAINING")),
            "{body}"
        );
    }
    for long in [long_a, long_b] {
        let (code, body, _) = long.await.unwrap();
        assert_eq!(
            (code, body["stateVersion"].as_u64()),
            (200, Some(1)),
            "{body}"
        );
    }
    let exit = replica
        .exit_status(std::time::Duration::from_secs(10))
        .await;
    assert!(exit.success(), "the drained sidecar exits cleanly: {exit}");
}

/// A turnSeq is an idempotency key, on both turn APIs: the same input gets
/// the stored result, another input 422 TURN_SEQ_REUSED naming the
/// turnSeq, and nothing runs or is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_seq_reused_with_another_input_is_refused() {
    let _one = serial().await;
    let replica = Replica::start(&[]).await;
    let http = reqwest::Client::new();
    let turns = format!("{}/v1/sessions/s-reuse/turns", replica.url);
    let chat = format!("{}/api/chat", replica.url);
    let (status, body, _) = send(
        http.post(&turns)
            .json(&json!({ "input": "my name is Lin", "turnSeq": 1 })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for request in [
        http.post(&turns)
            .json(&json!({ "input": "my name is Kai", "turnSeq": 1 })),
        http.post(&chat)
            .json(&json!({ "sessionId": "s-reuse", "input": "my name is Kai", "turnSeq": 1 })),
    ] {
        let (status, body, headers) = send(request).await;
        assert_eq!(
            (status, body["status"].as_str(), body["turnSeq"].as_u64()),
            (422, Some("TURN_SEQ_REUSED"), Some(1)),
            "{body}"
        );
        assert_eq!(headers["x-baton-outcome"], "TURN_SEQ_REUSED");
    }
    let (status, body, _) = send(
        http.post(&chat)
            .json(&json!({ "sessionId": "s-reuse", "input": "my name is Lin", "turnSeq": 1 })),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("DUPLICATE")),
        "{body}"
    );
    let (_, view, _) =
        send(http.get(format!("{}/v1/sessions/s-reuse?state=true", replica.url))).await;
    assert_eq!(view["version"], 1, "{view}");
    assert_eq!(view["state"]["payload"]["name"], "Lin", "{view}");
}

/// This machine's address on its default route: a connection to it does
/// not come from loopback.
fn non_loopback_ip() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    // No packet is sent: connecting a UDP socket only picks the route.
    socket
        .connect("10.254.254.254:9")
        .expect("a route off this machine, for a non-loopback address");
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "{ip}");
    ip
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_tokens_alone_guard_the_rollout_calls_and_leave_turns_open() {
    let _one = serial().await;
    let ip = non_loopback_ip();
    let admins = format!("--admin-tokens={TOKEN_ADMIN}");
    let replica = Replica::start(&["--listen=0.0.0.0:0", "--drain-timeout=20s", &admins]).await;
    let port = replica.url.rsplit(':').next().unwrap().to_owned();
    let remote = format!("http://{ip}:{port}");
    let http = reqwest::Client::new();

    // The turn API takes the tenant header, as without authentication.
    let (status, body, _) = send(
        http.post(format!("{remote}/v1/sessions/s-1/turns"))
            .json(&json!({ "input": "hi" })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The admin API does not.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/admin/status"),
        (reqwest::Method::POST, "/v1/admin/drain"),
        (reqwest::Method::POST, "/v1/admin/handover"),
    ] {
        let (status, body, _) = send(http.request(method, format!("{remote}{path}"))).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (401, Some("UNAUTHORIZED")),
            "{path}: {body}"
        );
    }
    let admin = |req: reqwest::RequestBuilder| req.bearer_auth(TOKEN_ADMIN);
    let (status, body, _) = send(admin(http.get(format!("{remote}/v1/admin/status")))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["layout"], baton_session::DATA_LAYOUT, "{body}");
    assert_eq!(body["abortedByDrain"], 0, "{body}");
    // A handover is for a drained replica.
    let (status, body, _) = send(admin(http.post(format!("{remote}/v1/admin/handover")))).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (409, Some("NOT_DRAINED")),
        "{body}"
    );

    // Draining: every answer closes its connection, so a client behind a
    // Service reconnects to a replica that serves.
    let running = in_background(
        &http,
        format!("{remote}/v1/sessions/s-long/turns"),
        "/sleep 1500",
    );
    one_turn_in_flight_at(&http, &remote, Some(TOKEN_ADMIN)).await;
    let (status, body, headers) = send(admin(http.post(format!("{remote}/v1/admin/drain")))).await;
    assert_eq!(
        (status, body["inFlight"].as_u64()),
        (202, Some(1)),
        "{body}"
    );
    assert_eq!(headers["connection"], "close");
    let (status, body, headers) = send(
        http.post(format!("{remote}/v1/sessions/s-2/turns"))
            .json(&json!({ "input": "hi" })),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("DRAINING")),
        "{body}"
    );
    assert_eq!(headers["connection"], "close");
    let (status, _, headers) = running.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers["connection"], "close");
    let drained = baton_testkit::poll_async(
        std::time::Duration::from_secs(10),
        "the drain to end",
        || async {
            let (_, s, _) = send(admin(http.get(format!("{remote}/v1/admin/status")))).await;
            s["drainedInMs"].as_u64().map(|ms| (ms, s))
        },
    )
    .await;
    assert!(
        drained.0 >= 500,
        "the drain waited for the running turn: {}",
        drained.1
    );
    assert_eq!(drained.1["abortedByDrain"], 0, "{}", drained.1);
    let (status, body, _) = send(admin(http.post(format!("{remote}/v1/admin/handover")))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["released"].as_u64(), body["stillHeld"].as_u64()),
        (Some(0), Some(0))
    );
    // No address is trusted: from the pod itself (loopback) a drain needs
    // the admin token too.
    drop(replica);
    let replica = Replica::start(&[&admins]).await;
    let (status, body, _) = send(http.post(format!("{}/v1/admin/drain", replica.url))).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (401, Some("UNAUTHORIZED")),
        "{body}"
    );
}
