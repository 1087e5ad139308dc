//! The agent contract over real HTTP.

use baton_agent::{AgentConfig, TurnRequest, TurnResponse};

async fn start(config: AgentConfig) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(baton_agent::serve(listener, config));
    url
}

fn request(
    input: &str,
    state: serde_json::Value,
    dir: &std::path::Path,
    turn_seq: u64,
) -> TurnRequest {
    TurnRequest {
        session: "s-1".into(),
        tenant: "acme".into(),
        turn_seq,
        input: input.into(),
        state,
        workspace_dir: dir.to_owned(),
    }
}

/// Runs one turn that must succeed and returns the agent's answer.
async fn ok_turn(http: &reqwest::Client, url: &str, req: &TurnRequest) -> TurnResponse {
    http.post(format!("{url}/v1/turn"))
        .json(req)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn memory_lives_in_the_state_and_files_in_the_workspace() {
    let url = start(AgentConfig::default()).await;
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let first = ok_turn(
        &http,
        &url,
        &request("my name is Lin", serde_json::Value::Null, dir.path(), 1),
    )
    .await;
    assert_eq!(first.reply, "Nice to meet you, Lin.");

    // A fresh agent process (another replica) answers from the state alone.
    let other = start(AgentConfig::default()).await;
    let second = ok_turn(
        &http,
        &other,
        &request("what is my name", first.state, dir.path(), 2),
    )
    .await;
    assert_eq!(second.reply, "Your name is Lin.");
    let notes = std::fs::read_to_string(dir.path().join("notes.md")).unwrap();
    assert_eq!(
        notes,
        "- turn 1: my name is Lin\n- turn 2: what is my name\n"
    );
}

#[tokio::test]
async fn failures_and_hostile_writes_are_errors() {
    let url = start(AgentConfig::default()).await;
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let failed = http
        .post(format!("{url}/v1/turn"))
        .json(&request("/fail", serde_json::Value::Null, &ws, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 500);
    let escape = http
        .post(format!("{url}/v1/turn"))
        .json(&request(
            "/write ../escaped.txt x",
            serde_json::Value::Null,
            &ws,
            1,
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(escape.status(), 422);
    assert!(!dir.path().join("escaped.txt").exists());
    let alien_state = http
        .post(format!("{url}/v1/turn"))
        .json(&request("hi", serde_json::json!({"turns": "many"}), &ws, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(alien_state.status(), 422);

    let always_failing = start(AgentConfig {
        failure_rate: 1.0,
        ..AgentConfig::default()
    })
    .await;
    let failed = http
        .post(format!("{always_failing}/v1/turn"))
        .json(&request("hi", serde_json::Value::Null, &ws, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 500);
}

#[tokio::test]
async fn an_echo_speed_turn_touches_no_file() {
    let url = start(AgentConfig {
        no_notes: true,
        ..AgentConfig::default()
    })
    .await;
    let http = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("never-created");
    let answer = ok_turn(
        &http,
        &url,
        &request("my name is Lin", serde_json::Value::Null, &ws, 1),
    )
    .await;
    assert_eq!(answer.reply, "Nice to meet you, Lin.");
    assert!(
        !ws.exists(),
        "the agent created {ws:?} for a turn that writes nothing"
    );
    // A turn that writes a file still gets its directory.
    let wrote = http
        .post(format!("{url}/v1/turn"))
        .json(&request("/write a.txt hello", answer.state, &ws, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(wrote.status(), 200);
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "hello\n"
    );
}
