//! Baton's turn protocol against the article's naive sequence, side by side
//! in one process against the same Redis, plus the embedded SQLite store.
//!
//! ```text
//! cargo bench -p baton-session --bench protocol            # 5 s per case
//! BATON_BENCH_SECS=10 cargo bench -p baton-session --bench protocol
//! ```
//!
//! Each client runs whole turns on a session of its own (uncontended) with a
//! 4 KiB state: begin, then commit the state back.
//! - baton: `begin.lua` + `commit.lua`, two round trips;
//! - naive: SET NX (lease), HGET version, HGET payload, Lua CAS, GET (owner
//!   check), DEL (release): six round trips, as in the source article.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionManager;
use ::redis::{AsyncCommands, Script};
use baton_session::redis::RedisStore;
use baton_session::sqlite::SqliteStore;
use baton_session::*;
use bytes::Bytes;

const STATE_BYTES: usize = 4096;

fn begin_req(key: &SessionKey, replica: &ReplicaId) -> BeginRequest {
    BeginRequest {
        key: key.clone(),
        replica: replica.clone(),
        turn_seq: None,
        cached_version: None,
        lease_ttl: Duration::from_secs(30),
        state_ttl: Duration::from_secs(3600),
    }
}

async fn baton_turn<S: TurnStore>(store: &S, key: &SessionKey, replica: &ReplicaId, state: &Bytes) {
    let BeginOutcome::Granted { lease, .. } =
        store.begin(&begin_req(key, replica)).await.expect("begin")
    else {
        panic!("uncontended begin was not granted");
    };
    let commit = CommitRequest {
        expected_version: lease.version,
        lease,
        payload: state.clone(),
        workspace: None,
        reply: Bytes::from_static(b"ok"),
        state_ttl: Duration::from_secs(3600),
        started_at_ms: 0,
        input_digest: String::new(),
    };
    let outcome = store.commit(&commit).await.expect("commit");
    assert!(matches!(outcome, CommitOutcome::Committed { .. }));
}

const NAIVE_CAS: &str = r"
if tonumber(redis.call('HGET', KEYS[1], 'version') or '0') == tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'version', ARGV[1] + 1, 'payload', ARGV[2])
  return 1
end
return 0";

async fn naive_turn(
    conn: &mut ConnectionManager,
    cas: &Script,
    session: &str,
    owner: &str,
    state: &Bytes,
) {
    let lease = format!("naive:{{{session}}}:lease");
    let data = format!("naive:{{{session}}}:state");
    let locked: Option<String> = ::redis::cmd("SET")
        .arg(&lease)
        .arg(owner)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .unwrap();
    assert!(locked.is_some(), "uncontended lock failed");
    let version: Option<u64> = conn.hget(&data, "version").await.unwrap();
    let _payload: Option<Vec<u8>> = conn.hget(&data, "payload").await.unwrap();
    let swapped: i64 = cas
        .key(&data)
        .arg(version.unwrap_or(0))
        .arg(state.as_ref())
        .invoke_async(conn)
        .await
        .unwrap();
    assert_eq!(swapped, 1);
    let holder: Option<String> = conn.get(&lease).await.unwrap();
    if holder.as_deref() == Some(owner) {
        let _: i64 = conn.del(&lease).await.unwrap();
    }
}

struct Figures {
    turns: usize,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
}

/// Runs `clients` loops of `turn` for `duration`; every latency is kept.
async fn measure<F, Fut>(clients: usize, duration: Duration, turn: F) -> Figures
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let turn = Arc::new(turn);
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let turn = turn.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    turn(client).await;
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Figures {
        turns: all.len(),
        elapsed,
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn row(name: &str, clients: usize, f: &Figures) {
    println!(
        "| {name} | {clients} | {:.0} | {:.0} | {:.0} |",
        f.turns as f64 / f.elapsed.as_secs_f64(),
        f.p50.as_secs_f64() * 1e6,
        f.p99.as_secs_f64() * 1e6
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let seconds: u64 = std::env::var("BATON_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let duration = Duration::from_secs(seconds);
    let state = Bytes::from(vec![b's'; STATE_BYTES]);
    let redis_server = baton_testkit::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();

    let baton = RedisStore::connect(&redis_server.url()).await.unwrap();
    let naive = ::redis::Client::open(redis_server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let sqlite = SqliteStore::open(&dir.path().join("bench.db"))
        .await
        .unwrap();
    let replica = ReplicaId::new("bench").unwrap();
    baton
        .heartbeat(&replica, Duration::from_secs(3600))
        .await
        .unwrap();
    sqlite
        .heartbeat(&replica, Duration::from_secs(3600))
        .await
        .unwrap();
    let cas = Arc::new(Script::new(NAIVE_CAS));

    println!(
        "{seconds} s per case, {STATE_BYTES}-byte state, one session per client, Redis {}",
        redis_server.url()
    );
    println!();
    println!("| protocol | clients | turns/s | p50 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    for clients in [1, 50] {
        let conn = naive.clone();
        let f = measure(clients, duration / 2, move |_| {
            let mut conn = conn.clone();
            async move {
                let _: String = ::redis::cmd("PING").query_async(&mut conn).await.unwrap();
                let _: String = ::redis::cmd("PING").query_async(&mut conn).await.unwrap();
            }
        })
        .await;
        row("baseline: 2 × PING", clients, &f);
        // Alternate the two Redis protocols so drift on the machine hits both.
        for round in 0..2 {
            let (store, state_b, r) = (baton.clone(), state.clone(), replica.clone());
            let f = measure(clients, duration / 2, move |c| {
                let (store, state, r) = (store.clone(), state_b.clone(), r.clone());
                async move {
                    let key = SessionKey::new("bench", &format!("baton-{c}")).unwrap();
                    baton_turn(&store, &key, &r, &state).await;
                }
            })
            .await;
            row(&format!("baton 2-RTT (run {})", round + 1), clients, &f);

            let (conn, cas_n, state_n) = (naive.clone(), cas.clone(), state.clone());
            let f =
                measure(clients, duration / 2, move |c| {
                    let (mut conn, cas, state) = (conn.clone(), cas_n.clone(), state_n.clone());
                    async move {
                        naive_turn(&mut conn, &cas, &format!("naive-{c}"), "bench", &state).await
                    }
                })
                .await;
            row(&format!("naive 6-RTT (run {})", round + 1), clients, &f);
        }
        let (store, state_s, r) = (sqlite.clone(), state.clone(), replica.clone());
        let f = measure(clients, duration, move |c| {
            let (store, state, r) = (store.clone(), state_s.clone(), r.clone());
            async move {
                let key = SessionKey::new("bench", &format!("sqlite-{c}")).unwrap();
                baton_turn(&store, &key, &r, &state).await;
            }
        })
        .await;
        row("embedded (SQLite)", clients, &f);
    }
}
