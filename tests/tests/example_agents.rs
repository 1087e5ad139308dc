//! The example agents of `docs/agents/` (Python and TypeScript, about 30
//! lines each, and each in a streaming variant) against the sidecar's contract: two `baton sidecar`
//! replicas on one embedded store in front of one agent process, as in a
//! pod pair. A session's state and workspace files cross replicas (the agent
//! keeps nothing in its process), a retried turn is answered from the store,
//! a reused `turnSeq` with another input is refused, and a stopped agent is
//! AGENT_UNAVAILABLE with nothing committed.
//!
//! Needs python3, node and `tsc` on PATH (`scripts/setup-test-deps` links
//! the TypeScript of the example's lock file).

use baton_e2e::{REPO, baton};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use baton_e2e::support::sse::{names, stream_turn, streamed_text};
use serde_json::{Value, json};

/// Child processes killed when the test ends, whatever its outcome.
#[derive(Default)]
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `cmd` and returns the `http://…` address its first line prints.
fn start(processes: &mut Processes, mut cmd: Command, what: &str) -> String {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} starts: {e}"));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    processes.0.push(child);
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("{what} printed no address: {line:?}"))
        .trim_end_matches('/')
        .to_owned()
}

fn sidecar(dir: &Path, replica: &str, agent_url: &str) -> Command {
    let mut cmd = Command::new(baton());
    cmd.arg("sidecar")
        .arg(format!("--replica-id={replica}"))
        .arg("--listen=127.0.0.1:0")
        .arg(format!("--agent-url={agent_url}"))
        .arg("--sqlite-path")
        .arg(dir.join("baton.db"))
        .arg("--objects-dir")
        .arg(dir.join("objects"))
        .arg("--workspace-dir")
        .arg(dir.join(format!("workspace-{replica}")))
        .env("BATON_EXIT_WITH_PARENT", "1");
    cmd
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = http
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("sidecar answers");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn get(http: &reqwest::Client, url: String) -> (u16, String) {
    let r = http.get(url).send().await.expect("sidecar answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// The contract, through two sidecars in front of the agent `agent`; with
/// `streams`, an agent that streams its replies (contract version 2), whose
/// JSON clients get the collected answer and whose streaming clients see
/// the words arrive one by one.
async fn passes_the_contract(agent: Command, name: &str, streams: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut processes = Processes::default();
    let agent_url = start(&mut processes, agent, name);
    let a = start(
        &mut processes,
        sidecar(dir.path(), "a", &agent_url),
        "sidecar a",
    );
    let b = start(
        &mut processes,
        sidecar(dir.path(), "b", &agent_url),
        "sidecar b",
    );
    let http = reqwest::Client::new();
    for url in [&a, &b] {
        baton_testkit::poll_async(Duration::from_secs(30), "the sidecar ready", || async {
            let r = http.get(format!("{url}/readyz")).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
    }
    let turns = |base: &str| format!("{base}/v1/sessions/s-1/turns");

    let (status, first) = post(&http, turns(&a), json!({"input": "hello", "turnSeq": 1})).await;
    assert_eq!(status, 200, "{name}: {first}");
    assert_eq!(first["stateVersion"], 1, "{name}: {first}");
    assert!(
        first["reply"].as_str().unwrap().starts_with("turn 1:"),
        "{name}: {first}"
    );

    // The other replica continues from the stored state: the agent holds nothing.
    let (status, second) = post(
        &http,
        turns(&b),
        json!({"input": "my name is Lin", "turnSeq": 2}),
    )
    .await;
    assert_eq!(status, 200, "{name}: {second}");
    let reply = second["reply"].as_str().unwrap();
    assert!(reply.starts_with("turn 2:"), "{name}: {reply}");
    assert!(
        reply.contains("hello"),
        "{name}: the earlier input is in the state: {reply}"
    );
    assert_eq!(second["replica"], "b");

    // A retry is answered from the store, not run again.
    let (status, retry) = post(
        &http,
        turns(&a),
        json!({"input": "my name is Lin", "turnSeq": 2}),
    )
    .await;
    assert_eq!(status, 200, "{name}: {retry}");
    assert_eq!(retry["duplicate"], true, "{name}: {retry}");
    assert_eq!(retry["reply"], second["reply"]);
    let (status, reused) = post(&http, turns(&b), json!({"input": "other", "turnSeq": 2})).await;
    assert_eq!(
        (status, reused["status"].as_str()),
        (422, Some("TURN_SEQ_REUSED")),
        "{name}"
    );

    // The workspace file the agent appended to, committed with each turn.
    let (status, notes) = get(&http, format!("{a}/v1/sessions/s-1/files/notes.md")).await;
    assert_eq!(status, 200, "{name}: {notes}");
    assert_eq!(notes, "- hello\n- my name is Lin\n", "{name}");
    let (_, session) = get(&http, format!("{b}/v1/sessions/s-1?state=true")).await;
    let session: Value = serde_json::from_str(&session).unwrap();
    assert_eq!(session["state"]["payload"]["turns"], 2, "{name}: {session}");

    if streams {
        let (status, events, body) = stream_turn(
            &http,
            &format!("{b}/v1/sessions/s-2/turns"),
            json!({ "input": "stream this to me" }),
        )
        .await;
        assert_eq!(status, 200, "{name}: {body}");
        let names = names(&events);
        assert_eq!(names[..2], ["turn", "progress"], "{name}: {events:?}");
        assert_eq!(names.last(), Some(&"committed"), "{name}: {events:?}");
        let deltas = names.iter().filter(|n| **n == "delta").count();
        assert!(deltas >= 5, "{name}: word by word: {events:?}");
        let committed = &events.last().unwrap().data;
        assert_eq!(
            committed["reply"].as_str(),
            Some(streamed_text(&events).as_str()),
            "{name}: the words make the reply"
        );
        assert!(
            streamed_text(&events).starts_with("turn 1: you said"),
            "{name}: {committed}"
        );
    }

    // The agent stops: the turn fails without committing anything.
    let agent = &mut processes.0[0];
    agent.kill().unwrap();
    agent.wait().unwrap();
    let (status, refused) = post(
        &http,
        turns(&a),
        json!({"input": "still there?", "turnSeq": 3}),
    )
    .await;
    assert_eq!(
        (status, refused["status"].as_str()),
        (503, Some("AGENT_UNAVAILABLE")),
        "{name}: {refused}"
    );
    let (_, session) = get(&http, format!("{a}/v1/sessions/s-1")).await;
    let session: Value = serde_json::from_str(&session).unwrap();
    assert_eq!(session["version"], 2, "{name}: {session}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_example_agent_passes_the_contract() {
    let mut agent = Command::new("python3");
    agent
        .arg(format!("{REPO}/docs/agents/python/agent.py"))
        .env("BATON_AGENT_PORT", "0");
    passes_the_contract(agent, "python", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_streaming_example_agent_passes_the_contract() {
    let mut agent = Command::new("python3");
    agent
        .arg(format!("{REPO}/docs/agents/python/streaming_agent.py"))
        .env("BATON_AGENT_PORT", "0");
    passes_the_contract(agent, "python (streaming)", true).await;
}

/// `tsc` on PATH, and the node_modules it came with (for `@types/node`).
fn typescript() -> (PathBuf, PathBuf) {
    let tsc = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("tsc"))
        .find(|p| p.exists())
        .expect("tsc on PATH (scripts/setup-test-deps)");
    let modules = tsc
        .parent()
        .and_then(Path::parent)
        .map(|venv| venv.join("ts-node-modules"))
        .filter(|m| m.exists())
        .or_else(|| {
            // A plain `npm install` puts tsc in node_modules/.bin.
            std::fs::canonicalize(&tsc)
                .ok()?
                .ancestors()
                .find(|a| a.ends_with("node_modules"))
                .map(Path::to_path_buf)
        })
        .expect("the node_modules holding @types/node");
    (tsc, modules)
}

/// The TypeScript examples, compiled by `tsc` in strict mode.
fn typescript_build() -> tempfile::TempDir {
    let (tsc, modules) = typescript();
    let build = tempfile::tempdir().unwrap();
    for file in [
        "agent.ts",
        "streaming_agent.ts",
        "tsconfig.json",
        "package.json",
    ] {
        std::fs::copy(
            format!("{REPO}/docs/agents/typescript/{file}"),
            build.path().join(file),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink(&modules, build.path().join("node_modules")).unwrap();
    let out = Command::new(&tsc)
        .arg("-p")
        .arg(build.path())
        .output()
        .expect("tsc runs");
    assert!(
        out.status.success(),
        "tsc (strict) refused the example:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    build
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_example_agents_pass_the_contract() {
    let build = typescript_build();
    for (script, name, streams) in [
        ("dist/agent.js", "typescript", false),
        ("dist/streaming_agent.js", "typescript (streaming)", true),
    ] {
        let mut agent = Command::new("node");
        agent
            .arg(build.path().join(script))
            .env("BATON_AGENT_PORT", "0");
        passes_the_contract(agent, name, streams).await;
    }
}
