//! The dashboard in a real browser (headless Chromium over WebDriver)
//! against a live `baton dev`, on the embedded stores and on real Redis +
//! Postgres + SeaweedFS: sign-in, live updates while turns run, a lease
//! held by a long turn, the turn history and files, takeover of a session
//! whose holder is SIGSTOPped, a running turn's words as they stream and
//! its Stop, drain, the viewer role, forged and
//! CSRF-less actions, and hostile text shown as text. Screenshots of every
//! page land in `target/tmp/dashboard-screenshots/<stores>/`.

use baton_e2e::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::browser::Browser;
use support::{Cluster, ClusterOptions, Stores, serial, signal};

const VIEWER: &str = "viewer-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded() {
    let _one = serial().await;
    dashboard_in_a_browser(Stores::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_stores() {
    let _one = serial().await;
    dashboard_in_a_browser(Stores::Real).await;
}

async fn sign_in(browser: &Browser, dev: &Cluster, token: &str) {
    browser.goto(&format!("{}/dashboard", dev.url)).await;
    browser.wait_for("#token", "the sign-in page").await;
    browser.fill("#token", token).await;
    browser.click("#signin").await;
    browser.wait_for("#viewer", "the signed-in header").await;
}

/// Waits until the hydrated page is live (its wasm ran).
async fn hydrated(browser: &Browser) {
    browser
        .wait_for("body[data-hydrated=true]", "the page to hydrate")
        .await;
}

fn row(session: &str, cell: &str) -> String {
    format!("tr[data-key=\"default/{session}\"] td.{cell}")
}

async fn dashboard_in_a_browser(stores: Stores) {
    let tokens = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        tokens.path(),
        format!(
            "- {{name: vic, role: viewer, token: {VIEWER}}}\n- {{name: ops, role: operator, token: {OPERATOR}}}\n"
        ),
    )
    .unwrap();
    let dev = Cluster::start_with(ClusterOptions {
        stores,
        // Long enough that a SIGSTOPped holder still counts as alive when
        // the takeover comes: the takeover, not an expiry, frees it.
        heartbeat_interval: "5s",
        extra_args: vec![format!(
            "--dashboard-tokens-file={}",
            tokens.path().display()
        )],
        // `baton dev`'s own routes take a dashboard token once it has a file.
        dashboard_token: Some(VIEWER.into()),
        ..ClusterOptions::default()
    })
    .await;
    let label = match stores {
        Stores::Embedded => "embedded",
        Stores::Real => "real-stores",
        Stores::RealCluster => "redis-cluster",
    };
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("dashboard-screenshots")
        .join(label);
    let browser = Browser::start(shots).await;

    // Signed out, the dashboard asks for a token.
    browser
        .goto(&format!("{}/dashboard/replicas", dev.url))
        .await;
    browser.wait_for("#token", "the sign-in page").await;
    browser.fill("#token", "not-a-token-of-the-file").await;
    browser.click("#signin").await;
    browser.wait_for("#signin-failed", "a refused token").await;
    browser.screenshot("signin").await;
    sign_in(&browser, &dev, OPERATOR).await;
    hydrated(&browser).await;
    // Marks this page: a reload would lose it.
    browser
        .eval("window.__still_here = true; return null;")
        .await;

    // Turns run with an HTTP client appear on the open page.
    let mut replicas_of_turns = Vec::new();
    for _ in 0..2 {
        let (status, body) = dev.chat("s-live", "my name is Lin").await;
        assert_eq!(status, 200, "{body}");
        replicas_of_turns.push(body["replica"].as_str().unwrap().to_owned());
    }
    browser
        .wait_text(&row("s-live", "version"), "s-live at version 2", |t| {
            t == "2"
        })
        .await;
    let turns = browser.text(&row("s-live", "turns")).await.unwrap();
    assert_eq!(turns, "2");
    let last = browser.text(&row("s-live", "replica")).await.unwrap();
    assert!(
        last.starts_with(&replicas_of_turns[1]),
        "{last} vs {replicas_of_turns:?}"
    );
    assert_eq!(
        browser.eval("return window.__still_here === true;").await,
        json!(true),
        "the page updated without a reload"
    );

    // A long turn holds the lease: its owner and expiry show, then free
    // and one version more once it commits.
    dev.chat("s-long", "hello").await;
    browser
        .wait_text(&row("s-long", "version"), "s-long listed", |t| t == "1")
        .await;
    let long = {
        let (http, url) = (dev.http.clone(), dev.url.clone());
        tokio::spawn(async move {
            http.post(format!("{url}/api/chat"))
                .json(&json!({ "sessionId": "s-long", "input": "/sleep 6000" }))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let lease = browser
        .wait_text(&row("s-long", "lease"), "the long turn's lease", |t| {
            t.contains("replica-") && t.contains("expires in")
        })
        .await;
    browser.screenshot("sessions-leased").await;
    // Its page says since when the holder has it.
    browser
        .goto(&format!("{}/dashboard/sessions/default/s-long", dev.url))
        .await;
    let held = browser
        .wait_text("#lease", "the lease's acquisition", |t| {
            t.contains("acquired")
        })
        .await;
    assert!(held.contains("expires in"), "{held}");
    browser.goto(&format!("{}/dashboard", dev.url)).await;
    hydrated(&browser).await;
    let done = long.await.unwrap();
    assert_eq!(done["status"], "OK", "{done}");
    assert!(
        lease.starts_with(done["replica"].as_str().unwrap()),
        "{lease} / {done}"
    );
    browser
        .wait_text(&row("s-long", "lease"), "s-long free again", |t| {
            t == "free"
        })
        .await;
    browser
        .wait_text(&row("s-long", "version"), "s-long at version 2", |t| {
            t == "2"
        })
        .await;

    // Hostile text is shown, never run.
    let hostile = "<img src=x onerror=\"window.__pwned=1\">";
    let (status, _) = dev
        .post(
            &format!("{}/api/chat", dev.url),
            &json!({ "sessionId": hostile, "input": "<script>window.__pwned=2</script>" }),
        )
        .await;
    assert_eq!(status, 200);
    let shown = browser
        .wait_text(
            &format!(
                "tr[data-key=\"default/{}\"] td.id",
                hostile.replace('"', "\\\"")
            ),
            "the hostile id as text",
            |t| !t.is_empty(),
        )
        .await;
    assert_eq!(shown, hostile);
    browser.screenshot("sessions").await;

    // The session page: the turns in order with their replicas, and
    // notes.md of the current version.
    browser
        .goto(&format!("{}/dashboard/sessions/default/s-live", dev.url))
        .await;
    browser.wait_for("#turns", "the turn history").await;
    hydrated(&browser).await;
    for (i, replica) in replicas_of_turns.iter().enumerate() {
        let text = browser
            .text(&format!("tr.turn[data-seq=\"{}\"] td.replica", i + 1))
            .await
            .unwrap_or_default();
        assert!(
            text.starts_with(replica.as_str()),
            "turn {}: {text} vs {replica}",
            i + 1
        );
    }
    let notes = browser.text("pre.file-text").await.unwrap_or_default();
    assert!(notes.contains("turn 2: my name is Lin"), "{notes}");
    assert!(browser.exists("tr.file[data-name=\"notes.md\"]").await);
    browser.screenshot("session").await;
    browser
        .goto(&format!(
            "{}/dashboard/sessions/default/{}",
            dev.url,
            urlencode(hostile)
        ))
        .await;
    browser
        .wait_for("#session-id", "the hostile session's page")
        .await;
    assert_eq!(browser.text("#session-id").await.unwrap(), hostile);
    assert_eq!(
        browser.eval("return window.__pwned ?? null;").await,
        Value::Null
    );

    // Take over a session whose holder is stopped mid-turn.
    let support::HeldTurn {
        answer: stuck,
        holder,
        pid: stuck_pid,
        other_url,
    } = dev.held_turn("s-stuck", 5000).await;
    dev.pause(stuck_pid).await;
    browser
        .goto(&format!("{}/dashboard/sessions/default/s-stuck", dev.url))
        .await;
    browser
        .wait_text("#lease", "the stuck holder's lease", |t| {
            t.contains(&holder)
        })
        .await;
    browser.click("#takeover").await;
    browser
        .wait_for("#confirm", "the takeover's confirmation")
        .await;
    browser.screenshot("confirm-takeover").await;
    browser.click("#confirm").await;
    let outcome = browser
        .wait_text("#done", "the takeover's outcome", |t| t.contains("done"))
        .await;
    assert!(
        outcome.contains(&format!("fenced out {holder}")),
        "{outcome}"
    );
    let fence = browser.text("#fence").await.unwrap();
    assert!(
        outcome.contains(&format!("the fence is now {fence}")),
        "{outcome}"
    );
    let started = std::time::Instant::now();
    let (status, body) = dev
        .turn_on(&other_url, "s-stuck", &json!({ "input": "hello?" }), "")
        .await;
    assert_eq!(
        status, 200,
        "the next turn runs at once after the takeover: {body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    signal(stuck_pid, "CONT");
    let (status, refused) = stuck.await.unwrap();
    assert_eq!(
        (status, refused["status"].as_str()),
        (409, Some("LEASE_LOST")),
        "{refused}"
    );

    // A running turn's words show on its page as the agent writes them;
    // an operator stops it from there.
    dev.chat("s-words", "hello").await;
    let words = "Words arrive one after another on the session page <i>live</i>, until someone presses Stop";
    let streaming = {
        let (http, url) = (dev.http.clone(), dev.url.clone());
        let input = format!("/stream 60 150 {words}");
        tokio::spawn(async move {
            let answer = http
                .post(format!("{url}/api/chat"))
                .json(&json!({ "sessionId": "s-words", "input": input }))
                .send()
                .await
                .unwrap();
            (
                answer.status().as_u16(),
                answer.json::<Value>().await.unwrap(),
            )
        })
    };
    browser
        .goto(&format!("{}/dashboard/sessions/default/s-words", dev.url))
        .await;
    hydrated(&browser).await;
    browser
        .eval("window.__still_here = true; return null;")
        .await;
    let early = browser
        .wait_text("#live-output", "the running turn's first words", |t| {
            t.starts_with("Words")
        })
        .await;
    let later = browser
        .wait_text("#live-output", "more words without a reload", |t| {
            t.len() > early.len() + 10
        })
        .await;
    assert!(
        words.starts_with(&later) || later.starts_with("Words arrive"),
        "{later}"
    );
    assert!(
        !browser.exists("#live-output i").await,
        "the agent's markup is text: {later}"
    );
    assert_eq!(
        browser.eval("return window.__still_here === true;").await,
        json!(true),
        "the words came without a reload"
    );
    browser.screenshot("session-running-turn").await;
    browser.click("#stop").await;
    browser
        .wait_for("#confirm", "the stop's confirmation")
        .await;
    browser.screenshot("confirm-interrupt").await;
    browser.click("#confirm").await;
    let outcome = browser
        .wait_text("#done", "the stop's outcome", |t| t.contains("done"))
        .await;
    assert!(outcome.contains("stopped turn 2"), "{outcome}");
    let (status, stopped) = streaming.await.unwrap();
    assert_eq!(
        (status, stopped["status"].as_str()),
        (409, Some("INTERRUPTED")),
        "{stopped}"
    );
    // The page the Stop returned to (rendered after the interrupt) shows it.
    browser
        .wait_text(
            "tr.turn[data-seq=\"2\"] td.outcome",
            "turn 2 in the history, interrupted",
            |t| t == "interrupted",
        )
        .await;
    assert!(!browser.exists("#running-turn").await);

    // Drain a replica from its page: draining, then drained; the front
    // door stops sending it turns.
    browser
        .goto(&format!("{}/dashboard/replicas", dev.url))
        .await;
    browser
        .wait_for(
            "tr.replica[data-replica=\"replica-1\"] a.drain",
            "replica-1's drain",
        )
        .await;
    browser.screenshot("replicas").await;
    browser
        .click("tr.replica[data-replica=\"replica-1\"] a.drain")
        .await;
    browser
        .wait_for("#confirm", "the drain's confirmation")
        .await;
    browser.click("#confirm").await;
    browser
        .wait_text("#done", "the drain's outcome", |t| t.contains("done"))
        .await;
    hydrated(&browser).await;
    browser
        .wait_text(
            "tr.replica[data-replica=\"replica-1\"] td.state",
            "replica-1 drained",
            |t| t.starts_with("drained"),
        )
        .await;
    browser.screenshot("replicas-drained").await;
    baton_testkit::poll_async_every(
        Duration::from_millis(100),
        Duration::from_secs(10),
        "the front door to see replica-1 draining",
        || async { (dev.replica("replica-1").await["draining"] == json!(true)).then_some(()) },
    )
    .await;
    for i in 0..4 {
        let (status, body) = dev.chat(&format!("after-drain-{i}"), "hi").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["replica"], "replica-0", "{body}");
    }

    // The audit log shows both actions.
    browser.goto(&format!("{}/dashboard/audit", dev.url)).await;
    browser.wait_for("#audit", "the audit log").await;
    let audit = browser.text("#audit").await.unwrap();
    assert!(
        audit.contains("takeover") && audit.contains("default/s-stuck"),
        "{audit}"
    );
    assert!(
        audit.contains("drain") && audit.contains("replica-1"),
        "{audit}"
    );
    assert!(
        audit.contains("interrupt") && audit.contains("default/s-words turn 2"),
        "{audit}"
    );
    assert!(audit.contains("ops"), "{audit}");
    browser.screenshot("audit").await;

    // An operator's action without the form's CSRF token is refused.
    let status = browser
        .fetch_status("POST", "/dashboard/actions/drain", "replica=replica-0")
        .await;
    assert_eq!(status, 403);

    // A viewer sees no action, and a forged one is refused.
    browser.click("header form button").await;
    sign_in(&browser, &dev, VIEWER).await;
    browser
        .goto(&format!("{}/dashboard/replicas", dev.url))
        .await;
    browser
        .wait_for("#replicas", "the replicas as a viewer")
        .await;
    assert!(!browser.exists("a.drain").await);
    browser
        .goto(&format!("{}/dashboard/sessions/default/s-live", dev.url))
        .await;
    browser.wait_for("#turns", "a session as a viewer").await;
    assert!(!browser.exists("#takeover").await);
    let status = browser
        .fetch_status(
            "POST",
            "/dashboard/actions/drain",
            "replica=replica-0&csrf=forged",
        )
        .await;
    assert_eq!(status, 403);
    browser.screenshot("session-as-viewer").await;
    assert_eq!(
        dev.replica("replica-0").await["draining"],
        json!(false),
        "the forged drain did nothing"
    );
    browser.close().await;
}

fn urlencode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
