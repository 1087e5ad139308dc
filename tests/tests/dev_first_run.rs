//! What a new user meets first in `baton dev`: one `baton dev` per data
//! directory (a stale lock from a killed one is no obstacle), plain-text
//! replica logs without a line per turn, and a replica setting the sidecar
//! refuses stopping `baton dev` with that error instead of a restart loop.

use baton_e2e::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Runs `baton dev` on `data_dir` until it exits by itself (or `limit`
/// passes: then it is killed and None returned), with its output.
fn run_dev_until_exit(
    data_dir: &std::path::Path,
    env: &[(&str, &str)],
    limit: Duration,
) -> Option<(std::process::ExitStatus, String)> {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(baton())
        .arg("dev")
        .arg(format!("--listen=127.0.0.1:{}", baton_testkit::free_port()))
        .arg("--data-dir")
        .arg(data_dir)
        .envs(env.iter().copied())
        .env("BATON_EXIT_WITH_PARENT", "1")
        .stdin(Stdio::null())
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some((status, std::fs::read_to_string(out.path()).unwrap()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_baton_dev_on_one_data_directory_is_refused_until_the_first_is_gone() {
    let _serial = serial().await;
    let first = Cluster::start(Stores::Embedded).await;
    let (status, output) = run_dev_until_exit(&first.data_dir, &[], Duration::from_secs(20))
        .expect("the second baton dev exits at once");
    assert!(!status.success(), "{output}");
    assert!(
        output.contains(&format!("pid {}", first.pid())),
        "the message names the first one's pid: {output}"
    );
    assert!(output.contains("--data-dir"), "{output}");
    // The first one never noticed.
    assert_eq!(first.chat("s-1", "my name is Lin").await.0, 200);

    // Killed, it leaves its lock file behind: the kernel released the lock.
    signal(u64::from(first.pid()), "KILL");
    let data_dir = first.data_dir.clone();
    assert!(data_dir.join("baton-dev.lock").exists());
    let port = baton_testkit::free_port();
    let mut again = Command::new(baton())
        .arg("dev")
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(&data_dir)
        .env("BATON_EXIT_WITH_PARENT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let ready = baton_testkit::poll_async_every(
        Duration::from_millis(100),
        Duration::from_secs(60),
        "a new baton dev on the killed one's data directory",
        || async {
            let replicas: Vec<serde_json::Value> = http
                .get(format!("http://127.0.0.1:{port}/v1/dev/replicas"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            replicas.iter().all(|r| r["ready"] == true).then_some(())
        },
    );
    ready.await;
    let _ = again.kill();
    let _ = again.wait();
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_logs_are_plain_text_without_a_line_per_turn() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    for i in 0..20 {
        let (status, body) = dev.chat(&format!("log-{i}"), "my name is Lin").await;
        assert_eq!(status, 200, "{body}");
    }
    for replica in ["replica-0", "replica-1"] {
        for log in ["sidecar.log", "agent.log"] {
            let path = dev.data_dir.join("replicas").join(replica).join(log);
            let text = std::fs::read(&path).unwrap();
            assert!(
                !text.contains(&0x1b),
                "{}: escape bytes in a log file",
                path.display()
            );
            let text = String::from_utf8_lossy(&text);
            assert!(
                !text.contains("turn answered"),
                "{}: a line per turn at INFO:\n{text}",
                path.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_the_sidecar_refuses_stops_baton_dev_with_that_error() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (status, output) = run_dev_until_exit(
        dir.path(),
        &[("BATON_ADMIN_TOKENS", "short")],
        Duration::from_secs(30),
    )
    .expect("baton dev stops instead of restarting its replicas forever");
    eprintln!("stopped after {} ms", ms_since(started));
    assert!(!status.success(), "{output}");
    assert_eq!(
        output
            .matches("tokens must be at least 16 characters")
            .count(),
        1,
        "the setting's error, once: {output}"
    );
    assert!(!output.contains("restarting"), "{output}");
}

/// The README's kill -9 step in one request: which replica holds a
/// session's lease, with its pid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_holding_a_session_is_one_request_away() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let holding = |session: &'static str| {
        let (http, url) = (dev.http.clone(), dev.url.clone());
        async move {
            http.get(format!("{url}/v1/dev/replicas?holding={session}"))
                .send()
                .await
                .unwrap()
                .json::<Vec<serde_json::Value>>()
                .await
                .unwrap()
        }
    };
    assert!(holding("nobody-here").await.is_empty());
    let held = dev.held_turn("held", 3000).await;
    let found = holding("held").await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["pid"].as_u64(), Some(held.pid), "{found:?}");
    assert!(
        held.holder
            .starts_with(&format!("{}-", found[0]["id"].as_str().unwrap())),
        "{found:?} vs {}",
        held.holder
    );
}

/// `baton dev`'s own routes and its front door refuse in the sidecar's
/// JSON shape too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_devs_refusals_are_json_with_their_outcome() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    for (method, path, status, outcome) in [
        (
            reqwest::Method::GET,
            "/v1/dev/rollout",
            405,
            "METHOD_NOT_ALLOWED",
        ),
        (
            reqwest::Method::POST,
            "/v1/dev/replicas",
            405,
            "METHOD_NOT_ALLOWED",
        ),
        (reqwest::Method::GET, "/api/chat", 405, "METHOD_NOT_ALLOWED"),
        (reqwest::Method::GET, "/v1/nowhere", 404, "NOT_FOUND"),
    ] {
        let answer = dev
            .http
            .request(method.clone(), format!("{}{path}", dev.url))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{method} {path}");
        assert_eq!(
            answer.headers()["x-baton-outcome"],
            outcome,
            "{method} {path}"
        );
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(body["status"], outcome, "{method} {path}: {body}");
        assert!(body["error"].is_string(), "{body}");
    }
}
