//! Streamed turns (agent contract version 2): a client that asks for
//! `text/event-stream` sees the agent's words as they are written, then
//! the committed answer, or a failure that says nothing committed; a JSON
//! client of a streaming agent gets today's answer; an agent's broken or
//! malformed stream fails the turn and commits nothing. One sidecar and
//! the reference agent, as processes; a hand-written raw agent for the
//! streams the reference agent would never send.

use std::time::Duration;

use baton_e2e::support::sse::{names, stream_turn, stream_turn_with, streamed_text};
use baton_e2e::support::{Replica, serial};
use serde_json::{Value, json};

/// A turn asked for as JSON: its answer's body.
async fn json_turn(http: &reqwest::Client, url: &str, input: &str) -> Value {
    http.post(url)
        .json(&json!({ "input": input }))
        .send()
        .await
        .expect("the turn request")
        .json()
        .await
        .unwrap_or(Value::Null)
}

/// The session's committed version (0 when it has none).
async fn version(http: &reqwest::Client, base: &str, session: &str) -> u64 {
    let view: Value = http
        .get(format!("{base}/v1/sessions/{session}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    view["version"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_sees_the_words_before_the_commit_then_the_committed_answer() {
    let _one = serial().await;
    let replica = Replica::start(&[]).await;
    let http = reqwest::Client::new();
    let turns = format!("{}/v1/sessions/s-1/turns", replica.url);

    // Five pieces 300 ms apart: the first arrives while the turn still
    // runs (the replica says so), long before the commit.
    let mut in_flight_at_first_delta = None;
    let (status, events, _) = stream_turn_with(
        &http,
        &turns,
        json!({ "input": "/stream 5 300 The quick brown fox jumps." }),
        async |event| {
            if event.name == "delta" && in_flight_at_first_delta.is_none() {
                let status: Value = http
                    .get(format!("{}/v1/admin/status", replica.url))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                in_flight_at_first_delta = Some(status["inFlight"].clone());
            }
        },
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        in_flight_at_first_delta,
        Some(json!(1)),
        "the first delta came while the turn ran"
    );
    assert_eq!(
        names(&events),
        [
            "turn",
            "progress",
            "delta",
            "delta",
            "delta",
            "delta",
            "delta",
            "committed"
        ]
    );
    let turn = &events[0].data;
    assert_eq!(
        (turn["turnSeq"].as_u64(), turn["session"].as_str()),
        (Some(1), Some("s-1"))
    );
    assert_eq!(turn["replica"], "solo");
    let attempt = turn["attempt"].as_u64().expect("the attempt");
    assert_eq!(events[1].data["name"], "thinking");
    assert_eq!(streamed_text(&events), "The quick brown fox jumps.");
    let committed = &events.last().unwrap().data;
    assert_eq!(committed["status"], "OK");
    assert_eq!(committed["reply"], "The quick brown fox jumps.");
    assert_eq!(committed["stateVersion"], 1);
    // Ids: the attempt, then the event's place in it, from 0.
    let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    let expected: Vec<String> = (0..events.len())
        .map(|n| format!("{attempt}-{n}"))
        .collect();
    assert_eq!(ids, expected);

    // A JSON client of the same streaming agent gets today's answer.
    let answer = json_turn(&http, &turns, "/stream 3 0 collected for you").await;
    assert_eq!(
        (
            answer["status"].as_str(),
            answer["reply"].as_str(),
            answer["stateVersion"].as_u64()
        ),
        (Some("OK"), Some("collected for you"), Some(2)),
        "{answer}"
    );

    // A streaming client of an answer the agent did not stream: the turn,
    // then the answer.
    let (_, events, _) = stream_turn(&http, &turns, json!({ "input": "my name is Lin" })).await;
    assert_eq!(names(&events), ["turn", "committed"]);
    assert_eq!(events[1].data["reply"], "Nice to meet you, Lin.");
    assert_eq!(events[1].data["stateVersion"], 3);

    // The same turn again (its turnSeq): the stored answer, as a stream.
    let (_, events, _) = stream_turn(
        &http,
        &turns,
        json!({ "input": "my name is Lin", "turnSeq": 3 }),
    )
    .await;
    assert_eq!(names(&events), ["turn", "committed"]);
    assert_eq!(events[0].data["duplicate"], true);
    assert_eq!(events[1].data["status"], "DUPLICATE");
    assert_eq!(events[1].data["reply"], "Nice to meet you, Lin.");

    // Refused before it started: the refusal as JSON with its status, as
    // without a stream.
    let (status, events, body) =
        stream_turn(&http, &turns, json!({ "input": "hi", "turnSeq": 9 })).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (409, Some("GAP")),
        "{body}"
    );
    assert!(events.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_before_its_final_event_fails_the_turn_and_commits_nothing() {
    let _one = serial().await;
    let replica = Replica::start(&[]).await;
    let http = reqwest::Client::new();
    let turns = format!("{}/v1/sessions/cut/turns", replica.url);
    let (_, events, _) = stream_turn(&http, &turns, json!({ "input": "my name is Ada" })).await;
    assert_eq!(events.last().unwrap().data["stateVersion"], 1);

    let (status, events, _) = stream_turn(
        &http,
        &turns,
        json!({ "input": "/stream-cut 4 10 my name is Bob" }),
    )
    .await;
    assert_eq!(status, 200, "it started: the failure comes as an event");
    assert_eq!(
        names(&events),
        [
            "turn", "progress", "delta", "delta", "delta", "delta", "failed"
        ]
    );
    let failed = &events.last().unwrap().data;
    assert_eq!(failed["status"], "AGENT_FAILED", "{failed}");
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("without a final event"),
        "{failed}"
    );
    assert_eq!(
        version(&http, &replica.url, "cut").await,
        1,
        "nothing committed"
    );
    // The session goes on from what committed.
    let answer = json_turn(&http, &turns, "what is my name").await;
    assert_eq!(answer["reply"], "Your name is Ada.", "{answer}");
}

/// An agent that answers every turn with `body` as an event stream, and
/// counts the turns it was sent.
struct RawAgent {
    url: String,
    _task: tokio::task::JoinHandle<()>,
}

impl RawAgent {
    async fn start(body: &'static str) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    // The request: its head, then as many bytes as it says.
                    let mut request = Vec::new();
                    let mut buf = [0u8; 8192];
                    loop {
                        let Ok(n) = conn.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        request.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&request);
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length: usize = text[..end]
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            if request.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self { url, _task: task }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_agent_stream_is_agent_failed_and_commits_nothing() {
    let _one = serial().await;
    let cases: [(&str, &str); 6] = [
        (
            "event: delta\ndata: {\"text\":\"hi\"}\n\nevent: shout\ndata: {}\n\n",
            "is not one of delta, progress, final, error",
        ),
        (
            "event: delta\ndata: not json\n\n",
            "the data of a delta event",
        ),
        (
            "event: progress\ndata: {\"step\":1}\n\n",
            "must be an object with a name",
        ),
        (
            "event: error\ndata: {\"message\":\"the model is overloaded\"}\n\n",
            "the model is overloaded",
        ),
        (
            "event: final\ndata: {\"reply\":\"no state\"}\n\n",
            "the data of a final event",
        ),
        (
            "data: {\"text\":\"unnamed\"}\n\n",
            "\"message\" is not one of",
        ),
    ];
    let http = reqwest::Client::new();
    for (body, expected) in cases {
        let agent = RawAgent::start(body).await;
        let replica = Replica::start(&[&format!("--agent-url={}", agent.url)]).await;
        let turns = format!("{}/v1/sessions/raw/turns", replica.url);
        for streaming_client in [true, false] {
            let failed = if streaming_client {
                let (_, events, _) = stream_turn(&http, &turns, json!({ "input": "hi" })).await;
                assert_eq!(
                    events.last().unwrap().name,
                    "failed",
                    "{body:?}: {events:?}"
                );
                events.last().unwrap().data.clone()
            } else {
                let response = http
                    .post(&turns)
                    .json(&json!({ "input": "hi" }))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status().as_u16(), 502, "{body:?}");
                response.json().await.unwrap()
            };
            assert_eq!(failed["status"], "AGENT_FAILED", "{body:?}: {failed}");
            assert!(
                failed["error"].as_str().unwrap().contains(expected),
                "{body:?}: {failed} does not say {expected:?}"
            );
        }
        assert_eq!(
            version(&http, &replica.url, "raw").await,
            0,
            "{body:?}: nothing committed"
        );
    }

    // A stream over the limit (16 MiB) is cut off, not buffered.
    let long: &'static str = Box::leak(
        "event: delta\ndata: {\"text\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}\n\n"
            .repeat(16 * 1024 * 1024 / 60)
            .into_boxed_str(),
    );
    let agent = RawAgent::start(long).await;
    let replica = Replica::start(&[&format!("--agent-url={}", agent.url)]).await;
    let response = http
        .post(format!("{}/v1/sessions/raw/turns", replica.url))
        .json(&json!({ "input": "hi" }))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "AGENT_FAILED", "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("longer than"),
        "{body}"
    );
}

/// `baton dev`'s front door passes a stream on as the replica writes it
/// (buffered, every word would arrive at the end, with the commit), and its
/// reference agent streams every reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_devs_front_door_relays_a_stream_as_it_is_written() {
    use baton_e2e::support::{Cluster, Stores};
    let _one = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let turns = format!("{}/v1/sessions/dev-stream/turns", dev.url);
    // Three pieces a second apart: the commit comes at least two seconds
    // after the first piece, unless the front door held the stream back.
    let mut first_delta_at = None;
    let (_, events, _) = stream_turn_with(
        &dev.http,
        &turns,
        json!({ "input": "/stream 3 1000 one two three" }),
        async |event| {
            if event.name == "delta" && first_delta_at.is_none() {
                first_delta_at = Some(std::time::Instant::now());
            }
        },
    )
    .await;
    let gap = first_delta_at.expect("a delta").elapsed();
    assert_eq!(names(&events).last(), Some(&"committed"));
    assert!(
        gap >= Duration::from_millis(1500),
        "the first piece came only {gap:?} before the end: the stream was held back"
    );
    // Every reply streams in `baton dev` (4 pieces by default).
    let (_, events, _) = stream_turn(&dev.http, &turns, json!({ "input": "hello" })).await;
    assert_eq!(
        names(&events),
        [
            "turn",
            "progress",
            "delta",
            "delta",
            "delta",
            "delta",
            "committed"
        ]
    );
    assert_eq!(streamed_text(&events), "You said: hello (turn 2)");
}
