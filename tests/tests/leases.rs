//! Leases under stress, on real Redis + Postgres + S3 with live replica
//! processes: a turn with a big workspace must not starve its replica's
//! heartbeat into a false failover, and a lease a replica holds for a turn
//! it no longer runs is reclaimed at once.

use baton_e2e::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands as _;
use serde_json::{Value, json};
use support::{Cluster, ClusterOptions, Stores, serial};

/// `POST {base}/v1/sessions/{session}/turns` on a connection of its own
/// (the sidecar hands connections to its runtime threads in turn, so fresh
/// connections land on every thread, the heartbeat's included).
async fn turn(base: &str, session: &str, body: Value) -> (u16, Value) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let answer = http
        .post(format!("{base}/v1/sessions/{session}/turns"))
        .json(&body)
        .send()
        .await
        .expect("turn request");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// Watches every replica heartbeat key until stopped; returns the keys that
/// were ever missing and for how long (ms, at most).
fn watch_heartbeats(
    redis_url: String,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeMap<String, u128>> {
    tokio::spawn(async move {
        let client = redis::Client::open(redis_url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut missing_since: BTreeMap<String, Instant> = BTreeMap::new();
        let mut lapses: BTreeMap<String, u128> = BTreeMap::new();
        while !stop.load(Ordering::Relaxed) {
            for key in &keys {
                let alive: bool = conn.exists(key).await.unwrap();
                if alive {
                    if let Some(since) = missing_since.remove(key) {
                        let ms = since.elapsed().as_millis();
                        let worst = lapses.entry(key.clone()).or_default();
                        *worst = (*worst).max(ms);
                    }
                } else {
                    missing_since
                        .entry(key.clone())
                        .or_insert_with(Instant::now);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for (key, since) in missing_since {
            lapses.insert(key, since.elapsed().as_millis());
        }
        lapses
    })
}

/// A workspace of 96 MiB: walking and hashing it took the runtime thread
/// that also beats the heartbeat for about a second on every turn, so the
/// heartbeat key lapsed (its TTL is three beats, 450 ms here), the other
/// replica took the "dead" holder's lease while it worked, and the turn
/// ended LEASE_LOST after the agent had run. Now the blocking work runs
/// off the runtime, unchanged files are not hashed again, and the
/// heartbeat has a thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_workspace_does_not_starve_the_heartbeat_into_a_false_failover() {
    let _serial = serial().await;
    let dev = Cluster::start_with(ClusterOptions {
        stores: Stores::Real,
        heartbeat_interval: "150ms",
        ..ClusterOptions::default()
    })
    .await;
    let replicas = dev.replicas().await.expect("replica list");
    let url = |i: usize| replicas[i]["url"].as_str().unwrap().to_owned();
    let (a, b) = (url(0), url(1));
    let session = "big-workspace";

    let mut seq = 0;
    for file in ["big-1.txt", "big-2.txt", "big-3.txt"] {
        seq += 1;
        let (status, body) = turn(
            &a,
            session,
            json!({ "input": format!("/fill {file} 32"), "turnSeq": seq }),
        )
        .await;
        assert_eq!(status, 200, "{body}\n{}", dev.log());
    }

    let mut conn = baton_testkit::redis_admin(dev.redis_url().unwrap()).await;
    let heartbeats: Vec<String> = conn.keys("baton:hb:*").await.unwrap();
    assert_eq!(heartbeats.len(), 2, "{heartbeats:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_heartbeats(
        dev.redis_url().unwrap().to_owned(),
        heartbeats,
        stop.clone(),
    );

    // Each turn changes one small file (notes.md) and leaves 96 MiB as
    // they were; its agent takes 300 ms. While it holds the lease, the
    // client retries the same turnSeq on the other replica: BUSY while the
    // first holds the lease, DUPLICATE once it committed; an OK there would
    // mean the retry took the lease over.
    let mut retried = BTreeMap::<String, u32>::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..6 {
        seq += 1;
        let started = Instant::now();
        let body = json!({ "input": "/sleep 300", "turnSeq": seq });
        let first = tokio::spawn({
            let (a, body) = (a.clone(), body.clone());
            async move { turn(&a, session, body).await }
        });
        while !first.is_finished() {
            // Retries start once the first replica holds the lease: one
            // that came first would rightly run the turn itself.
            let lease = &dev.session(session).await["lease"];
            let held_by_first = lease["turnSeq"] == json!(seq)
                && lease["owner"]
                    .as_str()
                    .is_some_and(|o| o.starts_with("replica-0-"));
            if !held_by_first {
                continue;
            }
            let (status, answer) = turn(&b, session, body.clone()).await;
            let outcome = answer["status"].as_str().unwrap_or("?").to_owned();
            assert!(
                matches!(outcome.as_str(), "BUSY" | "DUPLICATE"),
                "a retry on the other replica ended {status} {answer}"
            );
            *retried.entry(outcome).or_default() += 1;
        }
        let (status, answer) = first.await.unwrap();
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 200, "turn {seq}: {answer}\n{}", dev.log());
        assert_eq!(answer["duplicate"], json!(false), "{answer}");
        // A retry after the commit gets the stored result.
        let (status, again) = turn(&b, session, body).await;
        assert_eq!(
            (status, &again["duplicate"]),
            (200, &json!(true)),
            "{again}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let lapses = watcher.await.unwrap();
    println!(
        "retries on the other replica: {retried:?}; slowest turn {} ms",
        slowest.as_millis()
    );
    assert!(
        lapses.is_empty(),
        "heartbeat keys lapsed (key: longest gap in ms): {lapses:?}"
    );
    assert!(
        retried.get("BUSY").copied().unwrap_or(0) > 0,
        "the retries never overlapped a running turn: {retried:?}"
    );
    let view = dev.session(session).await;
    assert_eq!(view["version"], json!(seq), "{view}");
}
