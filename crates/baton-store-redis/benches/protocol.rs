//! Baton's turn protocol against the article's naive sequence, side by side
//! in one process against the same Redis, plus the embedded SQLite store.
//!
//! ```text
//! cargo bench -p baton-store-redis --bench protocol            # 5 s per case
//! BATON_BENCH_SECS=10 cargo bench -p baton-store-redis --bench protocol
//! BATON_BENCH_ONLY=naive BATON_BENCH_CLIENTS=1 cargo bench -p baton-store-redis --bench protocol
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
//!   check), DEL (release): six round trips, as in the source article;
//! - C client: the same commands (PINGs, baton, naive) sent by a small C
//!   program on hiredis (`benches/c_reference/reference.c`, built for the
//!   run when `cc` and libhiredis-dev are there), at one client: the
//!   reference the Rust client is compared with in the same run;
//! - baton on a Redis Cluster of 3 masters (the same two round trips, to
//!   the session's master), interleaved with the rest, and the round trips
//!   per turn each store sent (counted by the connection).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionManager;
use ::redis::{AsyncCommands, Script};
use baton_session::*;
use baton_store_redis::RedisStore;
use baton_store_sqlite::SqliteStore;
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
        reclaim_own_lease: false,
        input_digest: None,
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
        input: None,
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

/// How a case runs its turns.
enum Runner {
    /// In this process: one turn for client number `n`.
    Turn(Arc<dyn Fn(usize) -> TurnFuture + Send + Sync>),
    /// The C reference client (`benches/c_reference/reference.c`), one
    /// process per client and slice, in one of its modes.
    C(Arc<CReference>, &'static str),
}

/// A named way to run turns.
struct Case {
    name: &'static str,
    runner: Runner,
}

impl Case {
    fn new<F, Fut>(name: &'static str, turn: F) -> Self
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Self {
            name,
            runner: Runner::Turn(Arc::new(move |n| Box::pin(turn(n)))),
        }
    }
}

/// The C client, built from source for this run with the machine's `cc`
/// and hiredis (`apt-get install libhiredis-dev`), so the Rust client's own
/// cost shows as a difference within one run: the issue's C-client figures
/// were taken on another day, and this machine's round trips vary by 4x
/// from day to day.
struct CReference {
    binary: std::path::PathBuf,
    port: u16,
    begin_lua: std::path::PathBuf,
    commit_lua: std::path::PathBuf,
}

impl CReference {
    fn build(dir: &std::path::Path, port: u16) -> Result<Self, String> {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let binary = dir.join("c-reference");
        let built = std::process::Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&binary)
            .arg(here.join("benches/c_reference/reference.c"))
            .arg("-lhiredis")
            .output()
            .map_err(|e| format!("cc: {e}"))?;
        if !built.status.success() {
            return Err(String::from_utf8_lossy(&built.stderr).into_owned());
        }
        Ok(Self {
            binary,
            port,
            begin_lua: here.join("src/scripts/begin.lua"),
            commit_lua: here.join("src/scripts/commit.lua"),
        })
    }

    /// Runs `mode` for `slice` as client `client`; returns the elapsed time
    /// it reports and every turn's latency.
    async fn run(&self, mode: &str, slice: Duration, client: usize) -> (Duration, Vec<Duration>) {
        let out = tokio::process::Command::new(&self.binary)
            .arg(self.port.to_string())
            .arg(mode)
            .arg(slice.as_millis().to_string())
            .arg(&self.begin_lua)
            .arg(&self.commit_lua)
            .arg(client.to_string())
            .output()
            .await
            .expect("C reference client");
        assert!(
            out.status.success(),
            "C reference client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines = std::str::from_utf8(&out.stdout)
            .expect("C reference output")
            .lines()
            .map(|l| Duration::from_nanos(l.parse().expect("nanoseconds")));
        let elapsed = lines.next().expect("elapsed line");
        (elapsed, lines.collect())
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

/// Runs every case for `duration` (each), as `slices` alternating slices of
/// `clients` concurrent loops each; every latency is kept.
async fn measure(cases: &[Case], clients: usize, duration: Duration, slices: u32) -> Vec<Figures> {
    let slice = duration / slices;
    let mut figures: Vec<Figures> = cases.iter().map(|_| Figures::default()).collect();
    for _ in 0..slices {
        for (case, figures) in cases.iter().zip(&mut figures) {
            let started = Instant::now();
            let deadline = started + slice;
            let loops: Vec<_> = (0..clients)
                .map(|client| match &case.runner {
                    Runner::Turn(turn) => {
                        let turn = turn.clone();
                        tokio::spawn(async move {
                            let mut latencies = Vec::new();
                            while Instant::now() < deadline {
                                let t = Instant::now();
                                turn(client).await;
                                latencies.push(t.elapsed());
                            }
                            (None, latencies)
                        })
                    }
                    Runner::C(reference, mode) => {
                        let (reference, mode) = (reference.clone(), *mode);
                        tokio::spawn(async move {
                            let (elapsed, latencies) = reference.run(mode, slice, client).await;
                            (Some(elapsed), latencies)
                        })
                    }
                })
                .collect();
            let mut reported = Duration::ZERO;
            for one in loops {
                let (elapsed, latencies) = one.await.unwrap();
                reported = reported.max(elapsed.unwrap_or_default());
                figures.latencies.extend(latencies);
            }
            // A C process's own clock leaves out its start-up.
            figures.elapsed += if reported.is_zero() {
                started.elapsed()
            } else {
                reported
            };
        }
    }
    for f in &mut figures {
        f.latencies.sort();
    }
    figures
}

/// `base`'s p50 divided by `f`'s, as a table cell.
fn p50_ratio(base: Option<&Figures>, f: Option<&Figures>) -> String {
    match (base, f) {
        (Some(base), Some(f)) => format!(
            "{:.2}×",
            base.at(0.5).as_secs_f64() / f.at(0.5).as_secs_f64()
        ),
        _ => String::new(),
    }
}

fn row(name: &str, clients: usize, f: &Figures, versus_naive: String, versus_c: String) {
    println!(
        "| {name} | {clients} | {:.0} | {:.0} | {:.0} | {versus_naive} | {versus_c} |",
        f.latencies.len() as f64 / f.elapsed.as_secs_f64(),
        f.at(0.5).as_secs_f64() * 1e6,
        f.at(0.99).as_secs_f64() * 1e6
    );
}

const BASELINE: &str = "baseline: 2 × PING";
const BATON: &str = "baton 2-RTT";
const NAIVE: &str = "naive 6-RTT";
const BATON_CLUSTER: &str = "baton 2-RTT, Redis Cluster (3 masters)";
const C_BASELINE: &str = "C client: 2 × PING";
const C_BATON: &str = "C client: baton 2-RTT";
const C_NAIVE: &str = "C client: naive 6-RTT";

/// The C client's case for the same commands as a Rust case.
fn c_counterpart(name: &str) -> Option<&'static str> {
    match name {
        BASELINE => Some(C_BASELINE),
        BATON => Some(C_BATON),
        NAIVE => Some(C_NAIVE),
        _ => None,
    }
}

/// Requests the store's connection sent per turn, over 200 turns of one
/// session (uncontended: begin, then commit).
async fn round_trips_per_turn(store: &RedisStore, replica: &ReplicaId, state: &Bytes) -> f64 {
    let key = SessionKey::new("bench", "round-trips").unwrap();
    baton_turn(store, &key, replica, state, None).await;
    let before = baton_store_redis::requests_sent();
    for _ in 0..200 {
        baton_turn(store, &key, replica, state, None).await;
    }
    (baton_store_redis::requests_sent() - before) as f64 / 200.0
}

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
    let redis_cluster = baton_testkit::RedisCluster::start(3, 0);
    let dir = tempfile::tempdir().unwrap();

    let baton = RedisStore::connect(&redis_server.url()).await.unwrap();
    let on_cluster = RedisStore::connect(&redis_cluster.url()).await.unwrap();
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
    on_cluster
        .heartbeat(&replica, Duration::from_secs(3600))
        .await
        .unwrap();
    println!(
        "Round trips per turn (requests counted by the connection, 200 turns on one session): one server {:.2}, Redis Cluster {:.2}",
        round_trips_per_turn(&baton, &replica, &state).await,
        round_trips_per_turn(&on_cluster, &replica, &state).await
    );
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
    let c_reference = match CReference::build(dir.path(), redis_server.port) {
        Ok(reference) => Some(Arc::new(reference)),
        Err(why) => {
            println!("(no C reference client: {why})");
            None
        }
    };
    println!(
        "| protocol | clients | turns/s | p50 µs | p99 µs | naive p50 ÷ this p50 | this p50 ÷ the C client's |"
    );
    println!("|---|---|---|---|---|---|---|");
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
        let cold = Case::new(BATON, move |c| {
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
        let (store, state_c, r) = (on_cluster.clone(), state.clone(), replica.clone());
        let clustered = Case::new(BATON_CLUSTER, move |c| {
            let (store, state, r) = (store.clone(), state_c.clone(), r.clone());
            async move {
                let key = SessionKey::new("bench", &format!("cluster-{c}")).unwrap();
                baton_turn(&store, &key, &r, &state, None).await;
            }
        });
        let (conn, cas_n, state_n) = (naive.clone(), cas.clone(), state.clone());
        let naive_case = Case::new(NAIVE, move |c| {
            let (mut conn, cas, state) = (conn.clone(), cas_n.clone(), state_n.clone());
            async move { naive_turn(&mut conn, &cas, &format!("naive-{c}"), "bench", &state).await }
        });
        let mut cases = vec![baseline, cold, warm, clustered, naive_case];
        // The C client runs one blocking connection per process: it is the
        // reference for one client's latency.
        if let Some(reference) = c_reference.as_ref().filter(|_| clients == 1) {
            for (name, mode) in [(C_BASELINE, "ping"), (C_BATON, "baton"), (C_NAIVE, "naive")] {
                cases.push(Case {
                    name,
                    runner: Runner::C(reference.clone(), mode),
                });
            }
        }
        cases.retain(|case| case.name.contains(&only));
        let figures = measure(&cases, clients, duration, 20).await;
        let by_name = |name: &str| {
            cases
                .iter()
                .position(|case| case.name == name)
                .map(|i| &figures[i])
        };
        for (case, f) in cases.iter().zip(&figures) {
            let naive = match case.name {
                NAIVE | BASELINE | C_NAIVE | C_BASELINE => None,
                name if name.starts_with("C client") => by_name(C_NAIVE),
                _ => by_name(NAIVE),
            };
            let versus_c = c_counterpart(case.name).and_then(by_name);
            row(
                case.name,
                clients,
                f,
                p50_ratio(naive, Some(f)),
                p50_ratio(Some(f), versus_c),
            );
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
            row(
                embedded.name,
                clients,
                &figures[0],
                String::new(),
                String::new(),
            );
        }
    }
}
