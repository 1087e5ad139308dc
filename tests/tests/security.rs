//! The holes an attacker looks for first, each tried on live processes
//! (`baton dev`, `baton sidecar`): an anonymous request that drains, a
//! file name that breaks a session, actions that skip the dashboard's
//! gate, a foreign page's form that runs a turn. Each test fails on a
//! build that has the hole.

use baton_e2e::support;

use std::io::{Read as _, Write as _};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const OPERATOR_TOKEN: &str = "operator-token-0123456789";
const VIEWER_TOKEN: &str = "viewer-token-0123456789";

/// Sends `request` (raw bytes, so a path reaches the server exactly as
/// written: an HTTP client would resolve `..` first) to `addr` and
/// returns the status and body.
fn raw(addr: &str, request: &str) -> (u16, String) {
    raw_bytes(addr, request.as_bytes())
}

fn host_of(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// No replica of `dev` is draining, and each is ready.
async fn none_draining(dev: &Cluster) {
    for replica in dev.replicas().await.unwrap() {
        assert_eq!(replica["draining"], false, "{replica}");
        assert_eq!(replica["ready"], true, "{replica}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_door_forwards_no_admin_route_and_no_path_that_climbs_to_one() {
    let _serial = serial().await;
    let dev = Cluster::start_with(ClusterOptions {
        env: vec![
            (
                "BATON_AUTH_TOKENS".into(),
                "tenant-token-0123456789=acme".into(),
            ),
            ("BATON_ADMIN_TOKENS".into(), ADMIN_TOKEN.into()),
        ],
        ..ClusterOptions::default()
    })
    .await;
    let front = host_of(&dev.url).to_owned();
    // The GET that drained every replica through the front door, its
    // POST form, the admin routes with a valid admin token (the front door
    // is not where operators drain), and paths a forwarding client would
    // resolve to them.
    for (method, path, token) in [
        ("GET", "/v1/admin/prestop", None),
        ("POST", "/v1/admin/drain", None),
        ("POST", "/v1/admin/drain?wait=true", Some(ADMIN_TOKEN)),
        ("GET", "/v1/admin/status", Some(ADMIN_TOKEN)),
        (
            "POST",
            "/v1/admin/tenants/acme/sessions/s-1/takeover",
            Some(ADMIN_TOKEN),
        ),
        (
            "POST",
            "/v1/admin/tenants/acme/sessions/s-1/interrupt",
            Some(ADMIN_TOKEN),
        ),
        ("POST", "/v1/sessions/../admin/drain", Some(ADMIN_TOKEN)),
        ("POST", "/v1/sessions/%2e%2e/admin/drain", Some(ADMIN_TOKEN)),
        ("POST", "/v1/sessions/.%2E/admin/drain", Some(ADMIN_TOKEN)),
        ("GET", "/drained", None),
    ] {
        let auth = token
            .map(|t| format!("authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let (status, body) = raw(
            &front,
            &format!(
                "{method} {path} HTTP/1.1\r\nhost: {front}\r\n{auth}content-length: 0\r\nconnection: close\r\n\r\n"
            ),
        );
        assert_eq!(status, 404, "{method} {path}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(body["status"], "NOT_FOUND", "{method} {path}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("client API only")),
            "the refusal says why: {body}"
        );
    }
    none_draining(&dev).await;
    // An oversized body is refused on its announced length, before any of
    // it is read (the sidecar's limit, 1 MiB): 413, not a 64 MiB buffer
    // per request and a 502.
    let (status, body) = raw(
        &front,
        &format!(
            "POST /api/chat HTTP/1.1\r\nhost: {front}\r\ncontent-type: application/json\r\ncontent-length: 60000000\r\nconnection: close\r\n\r\n"
        ),
    );
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("TOO_LARGE") && body.contains("1048576"),
        "{body}"
    );
    // The client API still passes.
    let (status, body) = dev
        .post(
            &format!("{}/api/chat", dev.url),
            &json!({ "sessionId": "s-1", "input": "hi" }),
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (401, Some("UNAUTHORIZED")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_address_drains_a_sidecar_without_a_token_and_sigterm_does() {
    let _serial = serial().await;
    let admins = format!("--admin-tokens={ADMIN_TOKEN}");
    let replica = Replica::start(&[&admins, "--drain-timeout=10s"]).await;
    let http = reqwest::Client::new();
    let status_of = || async {
        http.get(format!("{}/v1/admin/status", replica.url))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    // From loopback, the address the preStop exemption trusted: the old
    // hook's route is gone, and a drain needs the admin token.
    let (status, body) = raw(
        host_of(&replica.url),
        "GET /v1/admin/prestop HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 404, "{body}");
    let answer = http
        .post(format!("{}/v1/admin/drain", replica.url))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
    // A turn in flight, so the drain SIGTERM starts below takes a while.
    let turn = tokio::spawn({
        let url = format!("{}/v1/sessions/s-long/turns", replica.url);
        async move {
            reqwest::Client::new()
                .post(url)
                .json(&json!({ "input": "/sleep 3000" }))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    baton_testkit::poll_async(Duration::from_secs(10), "the turn to run", || async {
        (status_of().await["inFlight"] == 1).then_some(())
    })
    .await;
    // The agent's preStop hook only waits: asked while nothing drains, it
    // holds the request and changes nothing.
    let waiting = tokio::spawn({
        let url = format!("{}/drained", replica.url);
        async move {
            let answer = reqwest::get(url).await.unwrap();
            (answer.status().as_u16(), answer.text().await.unwrap())
        }
    });
    assert_eq!(status_of().await["draining"], false);
    let ready = http
        .get(format!("{}/readyz", replica.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert!(!waiting.is_finished(), "the hook answered before any drain");
    // SIGTERM (what the kubelet sends the sidecar) drains; the waiting
    // hook then answers.
    replica.terminate();
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the hook answers once the sidecar drained")
        .unwrap();
    assert_eq!((status, body.as_str()), (200, "drained\n"), "{body}");
    // The drain let the running turn finish.
    assert_eq!(turn.await.unwrap(), 200);
}

/// On Kubernetes the admin API has a port of its own (`--admin-listen`),
/// which the deployment's NetworkPolicy opens to the operator and the
/// dashboard only: the turn port must then answer no admin route, even
/// with the admin token, and the admin port no turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_admin_listener_the_turn_port_answers_no_admin_route() {
    let _serial = serial().await;
    let admins = format!("--admin-tokens={ADMIN_TOKEN}");
    let replica = Replica::start(&[&admins, "--admin-listen=127.0.0.1:0"]).await;
    let admin = replica.admin_url.clone().expect("an admin URL printed");
    assert_ne!(admin, replica.url);
    let http = reqwest::Client::new();
    let send = |request: reqwest::RequestBuilder| async move {
        let answer = request.bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        let status = answer.status().as_u16();
        (status, answer.json::<Value>().await.unwrap_or(Value::Null))
    };
    for (method, path) in [
        (reqwest::Method::GET, "/v1/admin/status"),
        (reqwest::Method::POST, "/v1/admin/drain"),
        (reqwest::Method::POST, "/v1/admin/handover"),
        (
            reqwest::Method::POST,
            "/v1/admin/tenants/default/sessions/s-1/takeover",
        ),
        (
            reqwest::Method::POST,
            "/v1/admin/tenants/default/sessions/s-1/interrupt",
        ),
    ] {
        let url = format!("{}{path}", replica.url);
        let (status, body) = send(http.request(method.clone(), url)).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (404, Some("NOT_FOUND")),
            "{method} {path} on the turn port: {body}"
        );
    }
    for path in ["/v1/sessions/s-1/turns", "/api/chat"] {
        let (status, body) = send(
            http.post(format!("{admin}{path}"))
                .json(&json!({"input": "hi", "sessionId": "s-1"})),
        )
        .await;
        assert_eq!(status, 404, "POST {path} on the admin port: {body}");
    }
    // Each port does its own job.
    let (status, body) = send(
        http.post(format!("{}/v1/sessions/s-1/turns", replica.url))
            .json(&json!({"input": "hi"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(http.get(format!("{admin}/v1/admin/status"))).await;
    assert_eq!((status, &body["draining"]), (200, &json!(false)), "{body}");
    // Still only with the admin token.
    let anonymous = http
        .post(format!("{admin}/v1/admin/drain"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let (status, body) = send(http.post(format!("{admin}/v1/admin/drain"))).await;
    assert_eq!(status, 202, "{body}");
    let ready = http
        .get(format!("{}/readyz", replica.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503, "a drained replica is not ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_name_no_replica_could_restore_fails_its_turn_and_breaks_nothing() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let (status, body) = dev.chat("bs-2", "my name is Lin").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = dev.chat("bs-2", "/write x\\y z").await;
    assert_eq!(
        (status, body["status"].as_str(), body["file"].as_str()),
        (502, Some("AGENT_FAILED"), Some("x\\y")),
        "{body}"
    );
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("backslash")),
        "{body}"
    );
    // Nothing committed, and every replica serves the session on.
    for _ in 0..4 {
        let (status, body) = dev.chat("bs-2", "what is my name?").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["reply"], "Your name is Lin.", "{body}");
    }
    let session = dev.session("bs-2").await;
    assert_eq!(session["version"], 5, "{session}");
    // And after every replica was replaced (no local copy left).
    let out = dev.rollout();
    assert!(out.status.success(), "{out:?}");
    let (status, body) = dev.chat("bs-2", "what is my name?").await;
    assert_eq!(
        (status, body["stateVersion"].as_u64()),
        (200, Some(6)),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_pages_form_runs_no_turn_and_bodies_are_read_after_auth() {
    let _serial = serial().await;
    let dev = Cluster::start_with(ClusterOptions {
        env: vec![(
            "BATON_AUTH_TOKENS".into(),
            "tenant-token-0123456789=acme".into(),
        )],
        ..ClusterOptions::default()
    })
    .await;
    let chat = format!("{}/api/chat", dev.url);
    let named = || dev.http.post(&chat).bearer_auth("tenant-token-0123456789");
    let answer = named()
        .json(&json!({ "sessionId": "s-1", "input": "my name is Lin" }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    // What a page on another site can send without asking first.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let mut request = named()
            .header("origin", "https://evil.example")
            .body(r#"{"sessionId":"s-1","input":"my name is Mallory"}"#);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        let outcome = answer.headers()["x-baton-outcome"].clone();
        let body: Value = answer.json().await.unwrap();
        assert_eq!(
            (status, body["status"].as_str(), body["field"].as_str()),
            (415, Some("UNSUPPORTED_MEDIA_TYPE"), Some("content-type")),
            "{content_type:?}: {body}"
        );
        assert_eq!(outcome, "UNSUPPORTED_MEDIA_TYPE");
    }
    let answer = named()
        .json(&json!({ "sessionId": "s-1", "input": "what is my name?" }))
        .send()
        .await
        .unwrap();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["reply"], "Your name is Lin.", "{body}");
    // A missing field is named.
    let body: Value = named()
        .json(&json!({ "input": "hi" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (body["status"].as_str(), body["field"].as_str()),
        (Some("INVALID"), Some("sessionId")),
        "{body}"
    );
    // An anonymous body is refused for who sent it, not for what it holds:
    // 401 for a malformed megabyte, which was never parsed.
    let junk = "x".repeat(1024 * 1024 - 1);
    let answer = dev
        .http
        .post(&chat)
        .header("content-type", "application/json")
        .body(junk)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
}

/// A tokens file for `baton dev`'s dashboard.
fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.yaml");
    std::fs::write(
        &path,
        format!(
            "- {{name: olivia, role: operator, token: {OPERATOR_TOKEN}}}\n- {{name: victor, role: viewer, token: {VIEWER_TOKEN}}}\n"
        ),
    )
    .unwrap();
    path
}

/// `baton dev` with the tokens file of [`tokens_file`] in `dir`.
async fn with_dashboard_tokens(dir: &std::path::Path) -> Cluster {
    let tokens = tokens_file(dir);
    Cluster::start_with(ClusterOptions {
        extra_args: vec![format!("--dashboard-tokens-file={}", tokens.display())],
        dashboard_token: Some(VIEWER_TOKEN.into()),
        ..ClusterOptions::default()
    })
    .await
}

fn audit_lines(dev: &Cluster) -> Vec<Value> {
    std::fs::read_to_string(dev.data_dir.join("dashboard-audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_devs_own_routes_pass_the_dashboards_gate_and_are_audited() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let dev = with_dashboard_tokens(dir.path()).await;
    let rollout = format!("{}/v1/dev/rollout", dev.url);
    let replicas = format!("{}/v1/dev/replicas", dev.url);
    let generations = |list: &Vec<Value>| -> Vec<u64> {
        list.iter()
            .map(|r| r["generation"].as_u64().unwrap())
            .collect()
    };
    let list = |token: &'static str| {
        let http = dev.http.clone();
        let replicas = replicas.clone();
        async move {
            http.get(&replicas)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json::<Vec<Value>>()
                .await
                .unwrap()
        }
    };
    let before = generations(&list(VIEWER_TOKEN).await);
    // Reading the replicas needs a dashboard token.
    let answer = dev.http.get(&replicas).send().await.unwrap();
    assert_eq!(answer.status(), 401);
    assert_eq!(answer.headers()["x-baton-outcome"], "UNAUTHORIZED");

    // A foreign page's POST is refused on its Origin.
    let answer = dev
        .http
        .post(&rollout)
        .header("origin", "https://evil.example")
        .header("content-type", "text/plain")
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 403);
    let body: Value = answer.json().await.unwrap();
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("origin")),
        "{body}"
    );
    // No credentials, a forged token, a viewer.
    for (token, status) in [
        (None, 401),
        (Some("forged-token-0123456789"), 401),
        (Some(VIEWER_TOKEN), 403),
    ] {
        let mut request = dev.http.post(&rollout);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{token:?}");
        let body: Value = answer.json().await.unwrap();
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
    }
    assert_eq!(
        generations(&list(VIEWER_TOKEN).await),
        before,
        "no replica was restarted"
    );
    // Each refusal is audited, naming who tried.
    let refused: Vec<(String, bool)> = audit_lines(&dev)
        .iter()
        .filter(|e| e["action"] == "rollout")
        .map(|e| {
            (
                e["who"].as_str().unwrap().to_owned(),
                e["ok"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refused,
        [
            ("anonymous".to_owned(), false),
            ("unknown token".to_owned(), false),
            ("victor".to_owned(), false)
        ]
    );

    // The operator's token, from the CLI (read from a file, not argv).
    let token_file = dir.path().join("operator.token");
    std::fs::write(&token_file, OPERATOR_TOKEN).unwrap();
    let out = std::process::Command::new(baton())
        .args(["dev", "rollout", "--url", &dev.url])
        .env("BATON_DASHBOARD_TOKEN_FILE", &token_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let after = generations(&list(OPERATOR_TOKEN).await);
    assert!(
        after.iter().zip(&before).all(|(a, b)| a > b),
        "{before:?} -> {after:?}"
    );
    let last = audit_lines(&dev).pop().unwrap();
    assert_eq!(
        (
            last["who"].as_str(),
            last["action"].as_str(),
            last["ok"].as_bool()
        ),
        (Some("olivia"), Some("rollout"), Some(true)),
        "{last}"
    );
    // The replicas' logs say who drained them.
    let log = std::fs::read_to_string(
        dev.data_dir
            .join("replicas")
            .join("replica-0")
            .join("sidecar.log"),
    )
    .unwrap();
    assert!(
        log.contains("olivia (baton dev rollout)"),
        "the drain names its actor:\n{log}"
    );
}

/// Whether the command line of process `pid` holds `secret`.
fn command_line_holds(pid: u64, secret: &str) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&cmdline).contains(secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_passwords_reach_no_command_line() {
    let _serial = serial().await;
    const PASSWORD: &str = "pw-Xq7-never-in-argv";
    let redis = baton_testkit::RedisServer::start();
    let set = std::process::Command::new("redis-cli")
        .args(["-u", &redis.url(), "config", "set", "requirepass", PASSWORD])
        .output()
        .unwrap();
    assert!(set.status.success(), "{set:?}");
    let plain_url = redis.url();
    let redis_url = plain_url.replace("redis://", &format!("redis://:{PASSWORD}@"));
    let postgres = baton_testkit::PostgresServer::start();
    // Postgres trusts loopback here: the password is carried, not checked.
    let database_url = postgres
        .create_database("baton")
        .replace("postgres@", &format!("postgres:{PASSWORD}@"));
    let dev = Cluster::start_with(ClusterOptions {
        env: vec![
            ("BATON_REDIS_URL".into(), redis_url.clone()),
            ("BATON_DATABASE_URL".into(), database_url),
        ],
        ..ClusterOptions::default()
    })
    .await;
    // The replicas run on that Redis (the embedded store needs no password).
    let (status, body) = dev.chat("s-1", "my name is Lin").await;
    assert_eq!(status, 200, "{body}");
    let port = plain_url.trim_end_matches('/').rsplit(':').next().unwrap();
    let keys = std::process::Command::new("redis-cli")
        .args(["--no-auth-warning", "-p", port, "-a", PASSWORD, "dbsize"])
        .output()
        .unwrap();
    let keys: u64 = String::from_utf8_lossy(&keys.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {keys:?}"));
    assert!(keys > 0, "the session is in Redis ({plain_url})");
    let mut pids = vec![u64::from(dev.pid())];
    for replica in dev.replicas().await.unwrap() {
        pids.push(replica["pid"].as_u64().unwrap());
        pids.push(replica["agentPid"].as_u64().unwrap());
    }
    for pid in pids {
        assert!(
            !command_line_holds(pid, PASSWORD),
            "process {pid}'s command line holds the store password"
        );
    }
    assert!(!dev.log().contains(PASSWORD), "the log holds the password");
}

/// Sends `head` and then `trickle` one byte every `every` (a slow client),
/// and reads what the server answers until it closes the connection.
/// Returns the answer and how long the connection lasted.
fn slow_client(addr: &str, head: String, trickle: Vec<u8>, every: Duration) -> (String, Duration) {
    let started = std::time::Instant::now();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    std::thread::spawn(move || {
        for byte in trickle {
            // The behaviour under test, not a synchronisation.
            std::thread::sleep(every);
            if writer.write_all(&[byte]).is_err() {
                return;
            }
        }
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_on_every_listener() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let replica = Replica::start(&[]).await;
    let front = host_of(&dev.url).to_owned();
    let sidecar = host_of(&replica.url).to_owned();
    let headers_a_byte_every_half_second =
        b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"
            .to_vec();
    let body_head = |path: &str, host: &str, content_type: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: {content_type}\r\ncontent-length: 200\r\n\r\n"
        )
    };
    let body = vec![b' '; 200];
    let mut clients = Vec::new();
    for (what, addr, head, trickle) in [
        (
            "front door, headers",
            front.clone(),
            String::new(),
            headers_a_byte_every_half_second.clone(),
        ),
        (
            "sidecar, headers",
            sidecar.clone(),
            String::new(),
            headers_a_byte_every_half_second.clone(),
        ),
        (
            "front door, a turn's body",
            front.clone(),
            body_head("/api/chat", &front, "application/json"),
            body.clone(),
        ),
        (
            "sidecar, a turn's body",
            sidecar.clone(),
            body_head("/v1/sessions/s-1/turns", &sidecar, "application/json"),
            body.clone(),
        ),
        (
            "dashboard, the sign-in form's body",
            front.clone(),
            body_head(
                "/dashboard/signin",
                &front,
                "application/x-www-form-urlencoded",
            ),
            body.clone(),
        ),
    ] {
        clients.push(std::thread::spawn(move || {
            let (answer, lasted) = slow_client(&addr, head, trickle, Duration::from_millis(500));
            (what, answer, lasted)
        }));
    }
    for client in clients {
        let (what, answer, lasted) = client.join().unwrap();
        if what.ends_with("headers") {
            // 10 s to send headers; the client needed 40 s.
            assert!(
                lasted < Duration::from_secs(15),
                "{what}: open for {lasted:?}"
            );
            assert!(!answer.contains(" 200 "), "{what}: {answer}");
        } else {
            // 30 s for a body that would take 100 s.
            assert!(
                lasted < Duration::from_secs(40),
                "{what}: open for {lasted:?}"
            );
            assert!(answer.starts_with("HTTP/1.1 408"), "{what}: {answer}");
            assert!(answer.contains("REQUEST_TIMEOUT"), "{what}: {answer}");
        }
    }
    // Both still serve.
    let (status, body) = dev.chat("s-1", "hi").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_calls_no_sidecar_a_heartbeat_points_elsewhere() {
    use baton_session::{ReplicaId, TurnStore as _};
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    // Whoever can write to the stores advertises a listener of theirs.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let trap_url = format!("http://{}", trap.local_addr().unwrap());
    let store = baton_store_sqlite::SqliteStore::open(&dev.data_dir.join("baton.db"))
        .await
        .unwrap();
    store
        .heartbeat_with(
            &ReplicaId::new("replica-9-forged").unwrap(),
            baton_session::ReplicaInfo {
                replica: "replica-9".into(),
                url: Some(trap_url.clone()),
                ..Default::default()
            },
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let confirm = dev
        .http
        .get(format!(
            "{}/dashboard/confirm?action=drain&replica=replica-9",
            dev.url
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = confirm
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the confirmation page holds the form's token")
        .to_owned();
    // The replicas page (status of every live replica) and a drain.
    let page = dev
        .http
        .get(format!("{}/dashboard/replicas", dev.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let drained = dev
        .http
        .post(format!("{}/dashboard/actions/drain", dev.url))
        .form(&[("replica", "replica-9"), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert!(drained.status().is_success() || drained.status().is_redirection());
    let audited = std::fs::read_to_string(dev.data_dir.join("dashboard-audit.jsonl")).unwrap();
    assert!(
        audited.contains("cannot vouch for"),
        "the drain says why it called nobody: {audited}"
    );
    match trap.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the dashboard connected to the advertised address: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_baton_dev_answers_loopback_names_only_and_no_foreign_origin() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let front = host_of(&dev.url).to_owned();
    let port = front.rsplit(':').next().unwrap().to_owned();
    // DNS rebinding: a page of rebind.attacker.example whose name now
    // resolves to 127.0.0.1 sends its own name. Pages (which hold the CSRF
    // token), actions and the turn API alike refuse it.
    for (method, path, body) in [
        ("GET", "/dashboard", ""),
        ("GET", "/dashboard/replicas", ""),
        (
            "POST",
            "/dashboard/actions/takeover",
            "tenant=default&session=s-1&csrf=x",
        ),
        ("POST", "/api/chat", r#"{"sessionId":"s-1","input":"hi"}"#),
        ("GET", "/v1/dev/replicas", ""),
    ] {
        let (status, answer) = raw(
            &front,
            &format!(
                "{method} {path} HTTP/1.1\r\nhost: rebind.attacker.example:{port}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            ),
        );
        assert_eq!(status, 403, "{method} {path}: {answer}");
        assert!(answer.contains("loopback"), "{answer}");
    }
    // A loopback name, but a form posted from another site.
    let (status, answer) = raw(
        &front,
        &format!(
            "POST /dashboard/actions/drain HTTP/1.1\r\nhost: {front}\r\norigin: https://evil.example\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 22\r\nconnection: close\r\n\r\nreplica=replica-0&c=x1"
        ),
    );
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("origin"), "{answer}");
    // The names a user types work.
    for host in [front.clone(), format!("localhost:{port}")] {
        let (status, answer) = raw(
            &front,
            &format!("GET /dashboard HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"),
        );
        assert_eq!(status, 200, "{host}: {answer}");
    }
    none_draining(&dev).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_out_ends_live_updates_and_its_cookie_and_failed_sign_ins_are_limited() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let dev = with_dashboard_tokens(dir.path()).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed_in = http
        .post(format!("{}/dashboard/signin", dev.url))
        .form(&[("token", OPERATOR_TOKEN)])
        .send()
        .await
        .unwrap();
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let mut live = http
        .get(format!("{}/dashboard/live/replicas", dev.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(10), live.chunk())
        .await
        .expect("a first event")
        .unwrap();
    assert!(first.is_some_and(|c| !c.is_empty()));
    let out = http
        .post(format!("{}/dashboard/signout", dev.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert!(out.status().is_redirection());
    // The open stream ends (it sends one event a second while it lives).
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(_)) = live.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the live stream outlived its sign-in");
    // The cookie, replayed, is nobody's.
    let page = http
        .get(format!("{}/dashboard/replicas", dev.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert!(page.status().is_redirection(), "{}", page.status());
    let stream = http
        .get(format!("{}/dashboard/live/replicas", dev.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 401);

    // Wrong tokens: refused until the address's allowance is spent, then 429.
    let mut statuses = Vec::new();
    for i in 0..21 {
        let answer = http
            .post(format!("{}/dashboard/signin", dev.url))
            .form(&[("token", format!("wrong-token-{i:04}-0123456789"))])
            .send()
            .await
            .unwrap();
        statuses.push(answer.status().as_u16());
    }
    assert!(statuses[..20].iter().all(|s| *s == 303), "{statuses:?}");
    assert_eq!(statuses[20], 429, "{statuses:?}");
    assert!(
        dev.log().contains("dashboard sign-in failed"),
        "failed sign-ins are logged"
    );
    assert!(!dev.log().contains("wrong-token-"), "no token in the log");
}

/// `baton dev` once picked each replica's ports by binding port 0 and
/// letting go, then started the sidecar on that number: when another
/// process held it by then, the start failed, and so did every restart on
/// the same number. Each process now binds a port of its own choosing and
/// says which: here the port of a killed sidecar is taken before
/// `baton dev` restarts it, and the replica comes back anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarts_when_its_old_port_is_taken() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let before = dev.replica("replica-0").await;
    let url = before["url"]
        .as_str()
        .expect("a listening replica")
        .to_owned();
    let pid = before["pid"].as_u64().unwrap();
    let old = url.trim_start_matches("http://").to_owned();
    signal(pid, "KILL");
    // Take the port as soon as the kernel lets go of it.
    let held = baton_testkit::poll_async(Duration::from_secs(10), "the old port free", || {
        let old = old.clone();
        async move { std::net::TcpListener::bind(&old).ok() }
    })
    .await;
    let after = baton_testkit::poll_async(Duration::from_secs(30), "replica-0 back", || async {
        let replica = dev.replica("replica-0").await;
        (replica["ready"] == true && replica["pid"].as_u64() != Some(pid)).then_some(replica)
    })
    .await;
    assert_ne!(after["url"], before["url"], "{after}");
    assert!(after["restarts"].as_u64() >= Some(1), "{after}");
    let (status, body) = dev.chat("s-port", "hi").await;
    assert_eq!(status, 200, "{body}");
    drop(held);
}

const TENANT_TOKEN: &str = "tenant-token-0123456789";

/// Sends raw bytes (a request an HTTP client would refuse to write) and
/// returns the status and body; status 0 when the server closed the
/// connection without an answer.
fn raw_bytes(addr: &str, request: &[u8]) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // The server may answer (and close) before it has read everything.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// What a hostile request must get.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// A 4xx, or the connection closed: never a 5xx, never served.
    Refused,
    /// This status, with the JSON error shape naming it.
    Json(u16, &'static str),
    /// Exactly this status.
    Status(u16),
}

/// Requests no client should send, in the shapes a fuzzer or an attacker
/// tries first: broken framing, oversized parts, forged credentials.
/// `{path}` is the listener's API route (a POST taking JSON) and `{auth}`
/// its valid credential header.
fn hostile_requests(api: bool) -> Vec<(&'static str, Vec<u8>, Expect)> {
    let mut out: Vec<(&'static str, Vec<u8>, Expect)> = vec![
        ("no HTTP at all", b"NOT HTTP AT ALL\r\n\r\n".to_vec(), Expect::Refused),
        (
            "a control byte in a header",
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-a: a\x01b\r\nconnection: close\r\n\r\n".to_vec(),
            Expect::Refused,
        ),
        (
            "a 1 MiB header",
            format!(
                "GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {}\r\nconnection: close\r\n\r\n",
                "a".repeat(1 << 20)
            )
            .into_bytes(),
            Expect::Refused,
        ),
        (
            "10,000 headers",
            format!(
                "GET /healthz HTTP/1.1\r\nhost: x\r\n{}connection: close\r\n\r\n",
                (0..10_000).map(|i| format!("x-{i}: a\r\n")).collect::<String>()
            )
            .into_bytes(),
            Expect::Refused,
        ),
        (
            "two Content-Lengths that differ",
            b"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 40\r\nconnection: close\r\n\r\n{}".to_vec(),
            Expect::Refused,
        ),
        (
            "a 16 KiB query string (served)",
            format!(
                "GET /healthz?{} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                "a=b&".repeat(4 * 1024)
            )
            .into_bytes(),
            Expect::Status(200),
        ),
        (
            "a 64 KiB query string",
            format!(
                "GET /healthz?{} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                "a=b&".repeat(16 * 1024)
            )
            .into_bytes(),
            Expect::Refused,
        ),
    ];
    if api {
        let post = |headers: &str, body: &str| {
            format!(
                "POST {{path}} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        let turn = r#"{"sessionId":"s-hostile","input":"hi"}"#;
        out.extend([
            (
                "a forged bearer token",
                post("authorization: Bearer forged-token-0123456789\r\n", turn),
                Expect::Json(401, "UNAUTHORIZED"),
            ),
            (
                "a token of another scheme",
                post("authorization: Basic dXNlcjpwYXNzd29yZA==\r\n", turn),
                Expect::Json(401, "UNAUTHORIZED"),
            ),
            (
                "a Content-Length of 10 GB",
                b"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{auth}content-length: 10000000000\r\nconnection: close\r\n\r\n".to_vec(),
                Expect::Json(413, "TOO_LARGE"),
            ),
            (
                // Refused at the first bracket (a turn is an object), so
                // the depth is never reached.
                "JSON nested 100,000 deep",
                post("{auth}", &"[".repeat(100_000)),
                Expect::Json(422, "INVALID"),
            ),
            (
                "a JSON object nested 100,000 deep in a field",
                post(
                    "{auth}",
                    &format!(r#"{{"sessionId":"s","input":"hi","turnSeq":{}"#, "[".repeat(100_000)),
                ),
                Expect::Refused,
            ),
            (
                "a session id with a NUL",
                post("{auth}", r#"{"sessionId":"a\u0000b","input":"hi"}"#),
                Expect::Refused,
            ),
            (
                "a session id of 10 KB",
                post("{auth}", &format!(r#"{{"sessionId":"{}","input":"hi"}}"#, "s".repeat(10_000))),
                Expect::Refused,
            ),
        ]);
    }
    out
}

/// Sends every hostile request to `addr`, then checks it still serves.
fn try_hostile(listener: &str, addr: &str, path: &str, auth: &str, api: bool) {
    for (what, request, expect) in hostile_requests(api) {
        let request = String::from_utf8_lossy(&request)
            .replace("{path}", path)
            .replace("{auth}", auth);
        let (status, body) = raw_bytes(addr, request.as_bytes());
        let context = format!("{listener}, {what}: {status} {body}");
        match expect {
            Expect::Refused => assert!(status == 0 || (400..500).contains(&status), "{context}"),
            Expect::Status(code) => assert_eq!(status, code, "{context}"),
            Expect::Json(code, outcome) => {
                assert_eq!(status, code, "{context}");
                let body: Value = serde_json::from_str(&body)
                    .unwrap_or_else(|e| panic!("{context}: not JSON ({e})"));
                assert_eq!(body["status"], outcome, "{context}");
            }
        }
    }
}

/// The live-turn routes (rejoin, Stop, `onBusy`, the admin interrupt) with
/// ids and headers no client should send: each refused with the field it
/// broke, nothing running is stopped, and the replica serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_turn_routes_refuse_malformed_ids_and_headers() {
    let _serial = serial().await;
    let tenants = format!("--auth-tokens={TENANT_TOKEN}=acme");
    let admins = format!("--admin-tokens={ADMIN_TOKEN}");
    let replica = Replica::start(&[&tenants, &admins, "--admin-listen=127.0.0.1:0"]).await;
    let admin = replica.admin_url.clone().unwrap();
    let http = reqwest::Client::new();
    let turn = http
        .post(format!("{}/v1/sessions/s-1/turns", replica.url))
        .bearer_auth(TENANT_TOKEN)
        .json(&json!({"input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(turn.status(), 200);
    let long_id = "s".repeat(10_000);
    let long_event_id = "9".repeat(10_000);
    let turns = format!("{}/v1/sessions", replica.url);
    type Case<'a> = (&'a str, reqwest::RequestBuilder, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "rejoin without a token",
            http.get(format!("{turns}/s-1/turns/1/stream")),
            401,
            None,
        ),
        (
            "rejoin turn 0",
            http.get(format!("{turns}/s-1/turns/0/stream"))
                .bearer_auth(TENANT_TOKEN),
            400,
            Some("turnSeq"),
        ),
        (
            "rejoin turn -1",
            http.get(format!("{turns}/s-1/turns/-1/stream"))
                .bearer_auth(TENANT_TOKEN),
            400,
            Some("turnSeq"),
        ),
        (
            "rejoin a turn past u64",
            http.get(format!("{turns}/s-1/turns/99999999999999999999999/stream"))
                .bearer_auth(TENANT_TOKEN),
            400,
            Some("turnSeq"),
        ),
        (
            "rejoin a 10 KB session id",
            http.get(format!("{turns}/{long_id}/turns/1/stream"))
                .bearer_auth(TENANT_TOKEN),
            400,
            None,
        ),
        (
            "a Last-Event-ID that is no id",
            http.get(format!("{turns}/s-1/turns/1/stream"))
                .bearer_auth(TENANT_TOKEN)
                .header("last-event-id", "1-2-3"),
            400,
            Some("Last-Event-ID"),
        ),
        (
            "a 10 KB Last-Event-ID",
            http.get(format!("{turns}/s-1/turns/1/stream"))
                .bearer_auth(TENANT_TOKEN)
                .header("last-event-id", format!("{long_event_id}-1")),
            400,
            Some("Last-Event-ID"),
        ),
        (
            "rejoin a turn that kept no stream",
            http.get(format!("{turns}/s-1/turns/1/stream"))
                .bearer_auth(TENANT_TOKEN),
            404,
            None,
        ),
        (
            "Stop without a token",
            http.post(format!("{turns}/s-1/turns/1/interrupt")),
            401,
            None,
        ),
        (
            "Stop turn 0",
            http.post(format!("{turns}/s-1/turns/0/interrupt"))
                .bearer_auth(TENANT_TOKEN),
            400,
            Some("turnSeq"),
        ),
        (
            "Stop a turn that does not run",
            http.post(format!("{turns}/s-1/turns/7/interrupt"))
                .bearer_auth(TENANT_TOKEN),
            404,
            None,
        ),
        (
            "an onBusy nobody knows",
            http.post(format!("{turns}/s-1/turns?onBusy=sometimes"))
                .bearer_auth(TENANT_TOKEN)
                .json(&json!({"input": "hi"})),
            400,
            Some("onBusy"),
        ),
        (
            "admin interrupt without a token",
            http.post(format!(
                "{admin}/v1/admin/tenants/acme/sessions/s-1/interrupt"
            )),
            401,
            None,
        ),
        (
            "admin interrupt with a tenant's token",
            http.post(format!(
                "{admin}/v1/admin/tenants/acme/sessions/s-1/interrupt"
            ))
            .bearer_auth(TENANT_TOKEN),
            403,
            None,
        ),
        (
            "admin interrupt of turnSeq abc",
            http.post(format!(
                "{admin}/v1/admin/tenants/acme/sessions/s-1/interrupt?turnSeq=abc"
            ))
            .bearer_auth(ADMIN_TOKEN),
            400,
            Some("turnSeq"),
        ),
        (
            "admin interrupt of a turn that does not run",
            http.post(format!(
                "{admin}/v1/admin/tenants/acme/sessions/s-1/interrupt?turnSeq=2"
            ))
            .bearer_auth(ADMIN_TOKEN),
            404,
            None,
        ),
        (
            "admin interrupt of a 10 KB tenant",
            http.post(format!(
                "{admin}/v1/admin/tenants/{long_id}/sessions/s-1/interrupt"
            ))
            .bearer_auth(ADMIN_TOKEN),
            400,
            Some("tenant"),
        ),
    ];
    for (what, request, status, field) in cases {
        let answer = request.send().await.unwrap();
        let code = answer.status().as_u16();
        let body = answer.text().await.unwrap();
        assert_eq!(code, status, "{what}: {body}");
        if let Some(field) = field {
            let body: Value = serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {body}"));
            assert_eq!(body["field"], field, "{what}: {body}");
        }
    }
    // Nothing was stopped or lost: the session is at version 1 and takes
    // its next turn.
    let next = http
        .post(format!("{}/v1/sessions/s-1/turns", replica.url))
        .bearer_auth(TENANT_TOKEN)
        .json(&json!({"input": "still here?"}))
        .send()
        .await
        .unwrap();
    let next: Value = next.json().await.unwrap();
    assert_eq!(
        (next["status"].as_str(), next["stateVersion"].as_u64()),
        (Some("OK"), Some(2)),
        "{next}"
    );
}

/// The hostile-input suite on every listener a user's traffic reaches:
/// the sidecar's turn and admin ports, `baton dev`'s front door and its
/// dashboard. Each answers a clear refusal (never a 5xx) and serves the
/// next client as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_refuses_hostile_requests_and_goes_on_serving() {
    let _serial = serial().await;
    let tenants = format!("--auth-tokens={TENANT_TOKEN}=acme");
    let admins = format!("--admin-tokens={ADMIN_TOKEN}");
    let replica = Replica::start(&[&tenants, &admins, "--admin-listen=127.0.0.1:0"]).await;
    let tenant_auth = format!("authorization: Bearer {TENANT_TOKEN}\r\n");
    try_hostile(
        "sidecar turn port",
        host_of(&replica.url),
        "/v1/sessions/s-hostile/turns",
        &tenant_auth,
        true,
    );
    let admin = replica.admin_url.clone().unwrap();
    try_hostile(
        "sidecar admin port",
        host_of(&admin),
        "/v1/admin/handover",
        &format!("authorization: Bearer {ADMIN_TOKEN}\r\n"),
        false,
    );
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("{}/v1/sessions/s-after/turns", replica.url))
        .bearer_auth(TENANT_TOKEN)
        .json(&json!({"input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "the sidecar serves on");

    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(dir.path());
    let dev = Cluster::start_with(ClusterOptions {
        extra_args: vec![format!("--dashboard-tokens-file={}", tokens.display())],
        dashboard_token: Some(VIEWER_TOKEN.into()),
        env: vec![("BATON_AUTH_TOKENS".into(), format!("{TENANT_TOKEN}=acme"))],
        ..ClusterOptions::default()
    })
    .await;
    try_hostile(
        "front door",
        host_of(&dev.url),
        "/api/chat",
        &tenant_auth,
        true,
    );
    try_hostile(
        "dashboard",
        host_of(&dev.url),
        "/dashboard/signin",
        "",
        false,
    );
    // The dashboard's own refusals: a forged cookie is no sign-in, a forged
    // bearer token no API client, and a sign-in form is bounded up front.
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = no_redirect
        .get(format!("{}/dashboard", dev.url))
        .header("cookie", "baton_session=forged-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 303, "a forged cookie is sent to sign in");
    let replicas = no_redirect
        .get(format!("{}/v1/dev/replicas", dev.url))
        .bearer_auth("forged-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(replicas.status(), 401);
    let (status, body) = raw(
        host_of(&dev.url),
        "POST /dashboard/signin HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 10000000000\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 413, "{body}");
    let answer = http
        .post(format!("{}/api/chat", dev.url))
        .bearer_auth(TENANT_TOKEN)
        .json(&json!({"sessionId": "s-after", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "the front door serves on");
}
