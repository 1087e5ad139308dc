//! Live turns across replicas. Rejoining a running turn from anywhere: a
//! client whose connection broke mid-stream follows the rest of the turn
//! on another replica (each event once, resuming with `Last-Event-ID`), or
//! replays it after it committed; a replica killed mid-stream ends its
//! followers' streams with a failure, and the retry streams as a new
//! attempt. Interrupting: a turn sent with `?onBusy=interrupt` on one
//! replica stops a streaming turn on another (its agent's request closed,
//! nothing committed) and runs in its place; a Stop does the same without
//! a new turn. A drain lets a streaming turn finish within its timeout and
//! aborts one that outlasts it with a failure saying when to retry. The
//! history keeps what was said unless told to keep digests. A rolling
//! release under streamed load (`baton bench --stream --verify`) loses no
//! turn and shows no client words that did not commit. `baton dev` with
//! two replica processes, on the embedded stores and on real Redis,
//! Postgres and S3.

use std::time::Instant;

use baton_e2e::support::sse::{Event, Events, names, stream_turn, streamed_text};
use baton_e2e::support::{Cluster, ClusterOptions, Stores, serial, signal};
use serde_json::{Value, json};

/// The two replicas' sidecar URLs and the first one's process id.
async fn two_replicas(dev: &Cluster) -> (String, String, u64) {
    let replicas = dev.replicas().await.expect("the replica list");
    let url = |i: usize| replicas[i]["url"].as_str().unwrap().to_owned();
    (url(0), url(1), replicas[0]["pid"].as_u64().unwrap())
}

/// Reads `stream` until it has sent `deltas` deltas.
async fn until_deltas(stream: &mut Events, deltas: usize) -> Vec<Event> {
    let mut events = Vec::new();
    while events.iter().filter(|e: &&Event| e.name == "delta").count() < deltas {
        events.push(stream.next().await.expect("the stream goes on"));
    }
    events
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

async fn a_client_rejoins_on_another_replica_and_sees_each_event_once(stores: Stores) {
    let _one = serial().await;
    let dev = Cluster::start(stores).await;
    let (a, b) = {
        let (a, b, _) = two_replicas(&dev).await;
        (a, b)
    };
    let text = "one two three four five six seven eight";
    let mut first = Events::open(
        dev.http
            .post(format!("{a}/v1/sessions/rejoin/turns"))
            .json(&json!({ "input": format!("/stream 8 200 {text}") })),
    )
    .await
    .expect("a stream");
    let seen = until_deltas(&mut first, 3).await;
    drop(first); // the connection breaks mid-answer

    // On the other replica, from the last event seen: the rest, once.
    let stream_url = format!("{b}/v1/sessions/rejoin/turns/1/stream");
    let last = seen.last().unwrap().id.clone();
    let rest = Events::open(dev.http.get(&stream_url).header("last-event-id", &last))
        .await
        .expect("a stream")
        .rest()
        .await;
    let all: Vec<Event> = seen.iter().chain(&rest).cloned().collect();
    assert_eq!(
        names(&all),
        [
            "turn",
            "progress",
            "delta",
            "delta",
            "delta",
            "delta",
            "delta",
            "delta",
            "delta",
            "delta",
            "committed"
        ],
        "{all:?}"
    );
    let attempt = all[0].data["attempt"].as_u64().expect("the attempt");
    let expected: Vec<String> = (0..all.len()).map(|n| format!("{attempt}-{n}")).collect();
    assert_eq!(ids(&all), expected, "each event once, in order");
    assert_eq!(streamed_text(&all), text);
    let committed = &all.last().unwrap().data;
    assert_eq!(
        (
            committed["reply"].as_str(),
            committed["stateVersion"].as_u64()
        ),
        (Some(text), Some(1)),
        "{committed}"
    );

    // After the commit: the whole turn again, from either replica or the
    // front door, with the same ids.
    for base in [&a, &b, &dev.url] {
        let replay = Events::open(
            dev.http
                .get(format!("{base}/v1/sessions/rejoin/turns/1/stream")),
        )
        .await
        .expect("a stream")
        .rest()
        .await;
        assert_eq!(ids(&replay), expected, "replayed by {base}");
    }
    // A client that saw the end and came back (as a browser's EventSource
    // does) is told there is no more.
    let again = dev
        .http
        .get(&stream_url)
        .header("last-event-id", all.last().unwrap().id.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 204);

    // A turn nobody followed (its JSON client stayed to the end) kept no
    // stream: it cost the store nothing, and a replay says how to get its
    // answer.
    let (status, answer) = dev
        .turn_on(&a, "rejoin", &json!({ "input": "hello" }), "")
        .await;
    assert_eq!(status, 200, "{answer}");
    let gone = dev
        .http
        .get(format!("{b}/v1/sessions/rejoin/turns/2/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status().as_u16(), 404);
    let gone: Value = gone.json().await.unwrap();
    assert!(
        gone["error"]
            .as_str()
            .unwrap()
            .contains("turnSeq 2 for its answer"),
        "{gone}"
    );

    // Refused, with the field named.
    let refused = |path: String, last_event_id: Option<&'static str>| {
        let mut request = dev.http.get(format!("{b}{path}"));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    for (path, id, status, field) in [
        (
            "/v1/sessions/rejoin/turns/1/stream",
            Some("7"),
            400,
            Some("Last-Event-ID"),
        ),
        (
            "/v1/sessions/rejoin/turns/1/stream",
            Some("1-x"),
            400,
            Some("Last-Event-ID"),
        ),
        (
            "/v1/sessions/rejoin/turns/0/stream",
            None,
            400,
            Some("turnSeq"),
        ),
        (
            "/v1/sessions/rejoin/turns/x/stream",
            None,
            400,
            Some("turnSeq"),
        ),
        (
            "/v1/sessions/rejoin/turns/99999999999999999999/stream",
            None,
            400,
            Some("turnSeq"),
        ),
        ("/v1/sessions/rejoin/turns/3/stream", None, 404, None),
        ("/v1/sessions/nobody/turns/1/stream", None, 404, None),
    ] {
        let (got, body) = refused(path.to_owned(), id).await;
        assert_eq!(got, status, "{path} {id:?}: {body}");
        assert_eq!(body["field"].as_str(), field, "{path} {id:?}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
    }
}

async fn a_replica_killed_mid_stream_ends_its_followers_and_the_retry_is_a_new_attempt(
    stores: Stores,
) {
    let _one = serial().await;
    let dev = Cluster::start(stores).await;
    let (a, b, pid_a) = two_replicas(&dev).await;
    let mut writer = Events::open(
        dev.http
            .post(format!("{a}/v1/sessions/killed/turns"))
            .json(&json!({ "input": "/stream 40 250 a long answer that will never finish" })),
    )
    .await
    .expect("a stream");
    let began = until_deltas(&mut writer, 2).await;
    let attempt = began[0].data["attempt"].as_u64().expect("the attempt");

    // A follower on the other replica, caught up with the turn.
    let stream_url = format!("{b}/v1/sessions/killed/turns/1/stream");
    let mut follower = Events::open(dev.http.get(&stream_url))
        .await
        .expect("a stream");
    let followed = until_deltas(&mut follower, 2).await;
    assert_eq!(followed[0].data["attempt"].as_u64(), Some(attempt));

    signal(pid_a, "KILL");
    let killed = Instant::now();
    let rest = follower.rest().await;
    let ended = rest.last().expect("an end");
    assert_eq!(ended.name, "failed", "{rest:?}");
    assert_eq!(ended.data["status"], "LEASE_LOST", "{}", ended.data);
    assert_eq!(ended.data["turnSeq"], 1);
    eprintln!(
        "the follower's stream ended {} ms after the kill",
        killed.elapsed().as_millis()
    );
    assert!(
        rest.iter().all(|e| e.name != "committed"),
        "nothing committed: {rest:?}"
    );
    let view: Value = dev
        .http
        .get(format!("{b}/v1/sessions/killed"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["version"].as_u64().unwrap_or(0), 0, "{view}");

    // The client sends the turn again: a new attempt, streamed as such.
    let (status, events, body) = stream_turn(
        &dev.http,
        &format!("{b}/v1/sessions/killed/turns?wait=5s"),
        json!({ "input": "/stream 3 0 the retried answer", "turnSeq": 1 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let retried = events[0].data["attempt"].as_u64().expect("the attempt");
    assert!(retried > attempt, "attempt {retried} after {attempt}");
    assert_eq!(events.last().unwrap().data["stateVersion"], 1);
    // Rejoined from the start, the turn's stream is the retry's alone:
    // what the killed attempt said is void.
    let replay = Events::open(dev.http.get(&stream_url))
        .await
        .expect("a stream")
        .rest()
        .await;
    assert_eq!(ids(&replay), ids(&events));
    assert_eq!(streamed_text(&replay), "the retried answer");
    // The ledger holds the turn once: the retry's attempt.
    let history = baton_testkit::poll_async(
        std::time::Duration::from_secs(20),
        "turn 1 in the history",
        || async {
            let view: Value = dev
                .http
                .get(format!("{b}/v1/sessions/killed"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let turns = view["turns"].as_array()?.clone();
            (!turns.is_empty()).then_some(turns)
        },
    )
    .await;
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0]["turnSeq"], 1, "{history:?}");
    assert_eq!(history[0]["fence"].as_u64(), Some(retried), "{history:?}");
}

/// The agents' count of streamed answers whose request the sidecar closed
/// before the end.
async fn streams_abandoned(dev: &Cluster) -> u64 {
    let mut total = 0;
    for r in dev.replicas().await.expect("replica list") {
        let stats: Value = dev
            .http
            .get(format!("{}/v1/stats", r["agentUrl"].as_str().unwrap()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        total += stats["streamsAbandoned"].as_u64().unwrap();
    }
    total
}

async fn a_newer_turn_interrupts_a_streaming_turn_on_another_replica(stores: Stores) {
    let _one = serial().await;
    let dev = Cluster::start(stores).await;
    let (a, b, _) = two_replicas(&dev).await;
    let (status, _) = dev
        .turn_on(&a, "irq", &json!({ "input": "my name is Ada" }), "")
        .await;
    assert_eq!(status, 200);

    let mut running = Events::open(
        dev.http
            .post(format!("{a}/v1/sessions/irq/turns"))
            .json(&json!({ "input": "/stream 40 250 my name is Bob, and this goes on and on" })),
    )
    .await
    .expect("a stream");
    let began = until_deltas(&mut running, 2).await;
    let attempt = began[0].data["attempt"].as_u64().unwrap();
    assert_eq!(began[0].data["turnSeq"], 2);

    // Without a choice: BUSY, as ever. With a bad one: refused, named.
    let (status, body) = dev
        .turn_on(&b, "irq", &json!({ "input": "stop" }), "")
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (409, Some("BUSY")),
        "{body}"
    );
    for query in [
        "?onBusy=later",
        "?onBusy=reject&wait=1s",
        "?onBusy=wait&wait=forever",
    ] {
        let (status, body) = dev
            .turn_on(&b, "irq", &json!({ "input": "stop" }), query)
            .await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(
            ["onBusy", "wait"].contains(&body["field"].as_str().unwrap_or_default()),
            "{query}: {body}"
        );
    }

    let interrupted_at = Instant::now();
    let (status, events, body) = stream_turn(
        &dev.http,
        &format!("{b}/v1/sessions/irq/turns?onBusy=interrupt"),
        json!({ "input": "what is my name" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The running turn's client is told it was interrupted.
    let rest = running.rest().await;
    let ended = rest.last().expect("an end");
    assert_eq!(
        (ended.name.as_str(), ended.data["status"].as_str()),
        ("failed", Some("INTERRUPTED")),
        "{rest:?}"
    );
    eprintln!(
        "the interrupted turn's stream ended {} ms after the interrupt was sent",
        interrupted_at.elapsed().as_millis()
    );
    // The new input ran as the next turn (2: the interrupted one did not
    // commit), from the state before it: Bob never happened.
    let turn = &events[0].data;
    assert_eq!(turn["turnSeq"], 2, "{turn}");
    assert!(turn["attempt"].as_u64().unwrap() > attempt);
    let committed = &events.last().unwrap().data;
    assert_eq!(
        (
            committed["reply"].as_str(),
            committed["stateVersion"].as_u64()
        ),
        (Some("Your name is Ada."), Some(2)),
        "{committed}"
    );
    // The history keeps the interrupted input, below the turn that ran
    // in its place.
    let history = baton_testkit::poll_async(
        std::time::Duration::from_secs(20),
        "both turn 2s in the history",
        || async {
            let view: Value = dev
                .http
                .get(format!("{b}/v1/sessions/irq"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let turns = view["turns"].as_array()?.clone();
            (turns.len() == 3).then_some(turns)
        },
    )
    .await;
    let summary: Vec<(u64, bool)> = history
        .iter()
        .map(|t| (t["turnSeq"].as_u64().unwrap(), t["interrupted"] == true))
        .collect();
    assert_eq!(summary, [(2, false), (2, true), (1, false)], "{history:?}");
    assert_eq!(
        history[1]["input"],
        "/stream 40 250 my name is Bob, and this goes on and on"
    );
    assert!(history[1].get("reply").is_none(), "{:?}", history[1]);
    // The agent's request was closed, not left to run to its end.
    baton_testkit::poll_async(
        std::time::Duration::from_secs(10),
        "the interrupted agent request closed",
        || async { (streams_abandoned(&dev).await >= 1).then_some(()) },
    )
    .await;

    // A Stop, with no new turn: the running turn ends INTERRUPTED and
    // nothing commits; stopping it again finds nothing.
    let mut running = Events::open(
        dev.http
            .post(format!("{a}/v1/sessions/irq/turns"))
            .json(&json!({ "input": "/stream 40 250 my name is Eve, and so on" })),
    )
    .await
    .expect("a stream");
    let began = until_deltas(&mut running, 1).await;
    assert_eq!(began[0].data["turnSeq"], 3);
    let stop = format!("{b}/v1/sessions/irq/turns/3/interrupt");
    let wrong = dev
        .http
        .post(format!("{b}/v1/sessions/irq/turns/4/interrupt"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 404, "only the turn named");
    let stopped: Value = dev
        .http
        .post(&stop)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (stopped["turnSeq"].as_u64(), stopped["attempt"].as_u64()),
        (Some(3), began[0].data["attempt"].as_u64()),
        "{stopped}"
    );
    let rest = running.rest().await;
    assert_eq!(rest.last().unwrap().data["status"], "INTERRUPTED");
    let again = dev.http.post(&stop).send().await.unwrap();
    assert_eq!(again.status().as_u16(), 404);
    let (_, answer) = dev
        .turn_on(&b, "irq", &json!({ "input": "what is my name" }), "")
        .await;
    assert_eq!(
        (answer["reply"].as_str(), answer["stateVersion"].as_u64()),
        (Some("Your name is Ada."), Some(3)),
        "{answer}"
    );
}

async fn a_drain_lets_a_streaming_turn_finish_and_aborts_one_that_outlasts_it(stores: Stores) {
    let _one = serial().await;
    let dev = Cluster::start_with(ClusterOptions {
        stores,
        drain_timeout: "3s",
        ..ClusterOptions::default()
    })
    .await;
    let (a, b, _) = two_replicas(&dev).await;
    let open = |session: &'static str, input: &'static str| {
        Events::open(
            dev.http
                .post(format!("{a}/v1/sessions/{session}/turns"))
                .json(&json!({ "input": input })),
        )
    };
    let mut short = open("short", "/stream 4 400 finishes within the drain")
        .await
        .expect("a stream");
    let mut long = open("long", "/stream 40 250 outlasts the drain")
        .await
        .expect("a stream");
    until_deltas(&mut short, 1).await;
    until_deltas(&mut long, 1).await;
    let drain = dev
        .http
        .post(format!("{a}/v1/admin/drain"))
        .send()
        .await
        .unwrap();
    assert_eq!(drain.status().as_u16(), 202, "the drain started");

    // Within the drain timeout: it streams to its end and commits.
    let rest = short.rest().await;
    let end = rest.last().unwrap();
    assert_eq!(
        (end.name.as_str(), end.data["reply"].as_str()),
        ("committed", Some("finishes within the drain")),
        "{rest:?}"
    );
    // Past it: aborted, with a failure that says nothing committed and
    // when to send it again.
    let rest = long.rest().await;
    let end = rest.last().unwrap();
    assert_eq!(
        (end.name.as_str(), end.data["status"].as_str()),
        ("failed", Some("ABORTED")),
        "{rest:?}"
    );
    assert!(end.data["retryAfterMs"].as_u64().is_some(), "{}", end.data);
    // Sent again (the same turnSeq) to a replica that serves: it runs.
    let (status, events, body) = stream_turn(
        &dev.http,
        &format!("{b}/v1/sessions/long/turns"),
        json!({ "input": "/stream 2 0 sent again", "turnSeq": 1 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let committed = &events.last().unwrap().data;
    assert_eq!(
        (
            committed["reply"].as_str(),
            committed["stateVersion"].as_u64()
        ),
        (Some("sent again"), Some(1)),
        "{committed}"
    );
}

/// The turn history keeps what was said by default, digests alone with
/// `--ledger-content digest`; on the real stores (Postgres) and the
/// embedded one.
async fn the_history_shows_what_was_said_unless_told_to_keep_digests(stores: Stores) {
    let _one = serial().await;
    for (content, keeps_text) in [("full", true), ("digest", false)] {
        let dev = Cluster::start_with(ClusterOptions {
            stores,
            extra_args: vec![format!("--ledger-content={content}")],
            ..ClusterOptions::default()
        })
        .await;
        let (status, answer) = dev.chat("said", "my name is <b>Lin</b>").await;
        assert_eq!(status, 200, "{answer}");
        let turns = baton_testkit::poll_async(
            std::time::Duration::from_secs(20),
            "the turn in the ledger",
            || async {
                let view = dev.session("said").await;
                let turns = view["turns"].as_array()?.clone();
                (!turns.is_empty()).then_some(turns)
            },
        )
        .await;
        let turn = &turns[0];
        assert_eq!(
            turn["inputDigest"].as_str().map(str::len),
            Some(64),
            "{turn}"
        );
        if keeps_text {
            assert_eq!(turn["input"], "my name is <b>Lin</b>", "{turn}");
            assert_eq!(turn["reply"], answer["reply"], "{turn}");
        } else {
            assert!(
                turn.get("input").is_none() && turn.get("reply").is_none(),
                "{turn}"
            );
        }
    }
}

/// G9 with streams: `baton dev rollout` replaces every replica while
/// `baton bench --stream --verify` streams turns through the front door:
/// no turn fails (a turn its draining replica aborted is retried, as the
/// failure event says), none is lost or duplicated, and every client was
/// shown exactly the words that committed.
async fn a_rollout_under_streamed_load_loses_no_turn(stores: Stores) {
    let _one = serial().await;
    let dev = Cluster::start(stores).await;
    let started = Instant::now();
    let bench = dev.bench(&[
        "--sessions=24",
        "--concurrency=8",
        "--duration=15s",
        "--stream",
        "--stream-chunks=20",
        "--stream-interval-ms=15",
        "--verify",
    ]);
    baton_e2e::support::poll_turns(&dev, 20).await;
    let rollout = dev.rollout();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "the rollout must finish while the load still runs ({:?})",
        started.elapsed()
    );
    assert!(
        rollout.status.success(),
        "rollout failed: {}\n{}",
        String::from_utf8_lossy(&rollout.stderr),
        dev.log()
    );
    let out = bench.wait_with_output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("streamed bench under rollout: {report}");
    assert!(out.status.success(), "bench failed: {report}");
    assert_eq!(report["failed"], 0, "{report}");
    assert!(report["acknowledged"].as_u64().unwrap() > 20, "{report}");
    assert_eq!(report["verifyErrors"], json!([]), "{report}");
    let stream = &report["stream"];
    assert_eq!(stream["shownNotCommitted"], 0, "{report}");
    // Every acknowledged turn but a duplicate's answer streamed its 20
    // pieces.
    let fresh = report["outcomes"]["OK"].as_u64().unwrap();
    assert!(stream["deltas"].as_u64().unwrap() >= fresh * 20, "{report}");
    for r in dev.replicas().await.unwrap() {
        assert_eq!(r["generation"], 1, "every replica replaced once: {r}");
    }
}

/// Under streamed load, a second client rejoins every turn from its start
/// as soon as its first word is out (`baton bench --stream --follow`): each
/// follower is shown exactly the words its turn committed, though no turn
/// kept its stream until its follower asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_turn_followed_under_load_shows_what_committed() {
    let _one = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let out = dev
        .bench(&[
            "--sessions=12",
            "--concurrency=6",
            "--duration=5s",
            "--stream",
            "--follow",
            "--stream-chunks=30",
            "--stream-interval-ms=20",
            "--verify",
        ])
        .wait_with_output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "bench failed: {report}");
    assert_eq!(report["verifyErrors"], json!([]), "{report}");
    let stream = &report["stream"];
    let followed = stream["followedTurns"].as_u64().unwrap();
    assert!(followed >= 10, "{report}");
    assert_eq!(stream["shownNotCommitted"], 0, "{report}");
    // Each follower replayed its turn from the first word.
    assert!(
        stream["followedDeltas"].as_u64().unwrap() >= followed * 30,
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_under_streamed_load_embedded() {
    a_rollout_under_streamed_load_loses_no_turn(Stores::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_under_streamed_load_real_stores() {
    a_rollout_under_streamed_load_loses_no_turn(Stores::Real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_shows_what_was_said_embedded() {
    the_history_shows_what_was_said_unless_told_to_keep_digests(Stores::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_shows_what_was_said_real_stores() {
    the_history_shows_what_was_said_unless_told_to_keep_digests(Stores::Real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_and_streaming_turns_embedded() {
    a_drain_lets_a_streaming_turn_finish_and_aborts_one_that_outlasts_it(Stores::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_and_streaming_turns_real_stores() {
    a_drain_lets_a_streaming_turn_finish_and_aborts_one_that_outlasts_it(Stores::Real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_turn_interrupts_a_streaming_turn_embedded() {
    a_newer_turn_interrupts_a_streaming_turn_on_another_replica(Stores::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_turn_interrupts_a_streaming_turn_real_stores() {
    a_newer_turn_interrupts_a_streaming_turn_on_another_replica(Stores::Real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_rejoins_on_another_replica_embedded() {
    a_client_rejoins_on_another_replica_and_sees_each_event_once(Stores::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_rejoins_on_another_replica_real_stores() {
    a_client_rejoins_on_another_replica_and_sees_each_event_once(Stores::Real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_stream_embedded() {
    a_replica_killed_mid_stream_ends_its_followers_and_the_retry_is_a_new_attempt(Stores::Embedded)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_stream_real_stores() {
    a_replica_killed_mid_stream_ends_its_followers_and_the_retry_is_a_new_attempt(Stores::Real)
        .await;
}
