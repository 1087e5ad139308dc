//! Baton's turn protocol against the article's naive sequence, side by side
//! in one process against the same Redis, plus the embedded SQLite store.
//!
//! ```text
//! cargo bench -p baton-session --bench protocol            # 5 s per case
//! BATON_BENCH_SECS=10 cargo bench -p baton-session --bench protocol
//! BATON_BENCH_ONLY=naive BATON_BENCH_CLIENTS=1 cargo bench -p baton-session --bench protocol
//! ```
//!
//! This machine's speed drifts by tens of percent within seconds, so the
//! Redis cases are interleaved: each runs for many short slices in turn, and
//! every case sees the same weather. The figures that matter are the ratios
//! within one run.
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

/// One whole turn; returns the committed version. With `cached_version`
/// the caller says it holds that version's payload, so begin skips it.
async fn baton_turn<S: TurnStore>(
    store: &S,
    key: &SessionKey,
    replica: &ReplicaId,
    state: &Bytes,
    cached_version: Option<u64>,
) -> u64 {
    let request = BeginRequest {
        cached_version,
        ..begin_req(key, replica)
    };
    let BeginOutcome::Granted { lease, .. } = store.begin(&request).await.expect("begin") else {
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
    match store.commit(&commit).await.expect("commit") {
        CommitOutcome::Committed { version } => version,
        other => panic!("uncontended commit: {other:?}"),
    }
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

type TurnFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A named way to run one turn for client number `n`.
struct Case {
    name: &'static str,
    turn: Arc<dyn Fn(usize) -> TurnFuture + Send + Sync>,
}

impl Case {
    fn new<F, Fut>(name: &'static str, turn: F) -> Self
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Self {
            name,
            turn: Arc::new(move |n| Box::pin(turn(n))),
        }
    }
}

#[derive(Default)]
struct Figures {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Figures {
    fn at(&self, q: f64) -> Duration {
        let all = &self.latencies;
        all[((all.len() as f64 * q) as usize).min(all.len() - 1)]
    }
}

/// Runs every case for `duration` in all, as `slices` alternating slices of
/// `clients` concurrent loops each; every latency is kept.
async fn measure(cases: &[Case], clients: usize, duration: Duration, slices: u32) -> Vec<Figures> {
    let slice = duration / slices;
    let mut figures: Vec<Figures> = cases.iter().map(|_| Figures::default()).collect();
    for _ in 0..slices {
        for (case, figures) in cases.iter().zip(&mut figures) {
            let started = Instant::now();
            let deadline = started + slice;
            let loops: Vec<_> = (0..clients)
                .map(|client| {
                    let turn = case.turn.clone();
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
            for one in loops {
                figures.latencies.extend(one.await.unwrap());
            }
            figures.elapsed += started.elapsed();
        }
    }
    for f in &mut figures {
        f.latencies.sort();
    }
    figures
}

fn row(name: &str, clients: usize, f: &Figures, versus: Option<&Figures>) {
    let ratio = versus
        .map(|base| {
            format!(
                "{:.2}×",
                base.at(0.5).as_secs_f64() / f.at(0.5).as_secs_f64()
            )
        })
        .unwrap_or_default();
    println!(
        "| {name} | {clients} | {:.0} | {:.0} | {:.0} | {ratio} |",
        f.latencies.len() as f64 / f.elapsed.as_secs_f64(),
        f.at(0.5).as_secs_f64() * 1e6,
        f.at(0.99).as_secs_f64() * 1e6
    );
}

const BASELINE: &str = "baseline: 2 × PING";
const NAIVE: &str = "naive 6-RTT";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let seconds: u64 = std::env::var("BATON_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    // `BATON_BENCH_ONLY=naive` runs only the cases whose name contains it
    // (handy under perf or strace).
    let only = std::env::var("BATON_BENCH_ONLY").unwrap_or_default();
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
    println!("| protocol | clients | turns/s | p50 µs | p99 µs | naive p50 ÷ this p50 |");
    println!("|---|---|---|---|---|---|");
    // `BATON_BENCH_CLIENTS=1` runs only that concurrency.
    let concurrencies: Vec<usize> = std::env::var("BATON_BENCH_CLIENTS")
        .ok()
        .and_then(|c| c.parse().ok())
        .map_or_else(|| vec![1, 50], |c| vec![c]);
    for clients in concurrencies {
        let conn = naive.clone();
        let baseline = Case::new(BASELINE, move |_| {
            let mut conn = conn.clone();
            async move {
                let _: String = ::redis::cmd("PING").query_async(&mut conn).await.unwrap();
                let _: String = ::redis::cmd("PING").query_async(&mut conn).await.unwrap();
            }
        });
        let (store, state_b, r) = (baton.clone(), state.clone(), replica.clone());
        let cold = Case::new("baton 2-RTT", move |c| {
            let (store, state, r) = (store.clone(), state_b.clone(), r.clone());
            async move {
                let key = SessionKey::new("bench", &format!("baton-{c}")).unwrap();
                baton_turn(&store, &key, &r, &state, None).await;
            }
        });
        // A replica that ran the session's previous turn still holds its
        // payload: begin then skips it (the protocol's cached-version path).
        let held: Arc<Vec<std::sync::atomic::AtomicU64>> =
            Arc::new((0..clients).map(|_| Default::default()).collect());
        let (store, state_w, r) = (baton.clone(), state.clone(), replica.clone());
        let warm = Case::new("baton 2-RTT, caller holds the version", move |c| {
            let (store, state, r, held) = (store.clone(), state_w.clone(), r.clone(), held.clone());
            async move {
                use std::sync::atomic::Ordering::Relaxed;
                let key = SessionKey::new("bench", &format!("warm-{c}")).unwrap();
                let cached = Some(held[c].load(Relaxed)).filter(|v| *v > 0);
                let version = baton_turn(&store, &key, &r, &state, cached).await;
                held[c].store(version, Relaxed);
            }
        });
        let (conn, cas_n, state_n) = (naive.clone(), cas.clone(), state.clone());
        let naive_case = Case::new(NAIVE, move |c| {
            let (mut conn, cas, state) = (conn.clone(), cas_n.clone(), state_n.clone());
            async move { naive_turn(&mut conn, &cas, &format!("naive-{c}"), "bench", &state).await }
        });
        let cases: Vec<Case> = [baseline, cold, warm, naive_case]
            .into_iter()
            .filter(|case| case.name.contains(&only))
            .collect();
        let figures = measure(&cases, clients, duration * cases.len() as u32, 20).await;
        let naive_figures = cases
            .iter()
            .position(|case| case.name == NAIVE)
            .map(|i| &figures[i]);
        for (case, f) in cases.iter().zip(&figures) {
            let versus = naive_figures.filter(|_| case.name != NAIVE && case.name != BASELINE);
            row(case.name, clients, f, versus);
        }

        let (store, state_s, r) = (sqlite.clone(), state.clone(), replica.clone());
        let embedded = Case::new("embedded (SQLite)", move |c| {
            let (store, state, r) = (store.clone(), state_s.clone(), r.clone());
            async move {
                let key = SessionKey::new("bench", &format!("sqlite-{c}")).unwrap();
                baton_turn(&store, &key, &r, &state, None).await;
            }
        });
        if std::env::var_os("BATON_BENCH_SERVER_STATS").is_some() {
            // Redis's own time per command (µs/call), to split server from client cost.
            let mut conn = naive.clone();
            let stats: String = ::redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
                .unwrap();
            for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
                println!("    {line}");
            }
            let _: () = ::redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        if embedded.name.contains(&only) {
            let figures = measure(std::slice::from_ref(&embedded), clients, duration, 1).await;
            row(embedded.name, clients, &figures[0], None);
        }
    }
}
