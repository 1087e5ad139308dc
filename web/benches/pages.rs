//! What the dashboard costs on a big deployment: 100,000 sessions and
//! about 1,000,000 turns in Redis + Postgres (one session with 10,000).
//!
//! ```text
//! cargo bench -p baton-web --bench pages
//! BATON_BENCH_SESSIONS=20000 cargo bench -p baton-web --bench pages
//! ```
//!
//! The sessions go through the real turn path (`RedisLedgerStore`: begin,
//! commit, shipped to the ledger), one turn each; the other turns are
//! written into the ledger with SQL. The dashboard runs as its own process
//! (this binary again, `BATON_BENCH_SERVE=1`) so that its time, CPU and
//! RSS are its own. Figures:
//!
//! - each page: server time over loopback HTTP (p50, p99) and the
//!   dashboard's CPU per request (`/proc/<pid>/stat`);
//! - live updates: the turn path's throughput and client CPU per turn with
//!   no page open and with 10 live sessions pages open, each at another
//!   place in the list (pages with the same filters share one read a
//!   second), in rounds ordered A B B A;
//! - the browser bundle, gzipped; the dashboard's RSS after all that.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_ledger::RedisLedgerStore;
use baton_session::*;
use baton_testkit::{PostgresServer, RedisServer, free_port};
use bytes::Bytes;

const TENANT: &str = "acme";
const BIG: &str = "big";
const BIG_TURNS: i64 = 10_000;
const TURNS_PER_SESSION: i64 = 10;
const REQUESTS: usize = 50;

fn sessions_wanted() -> usize {
    std::env::var("BATON_BENCH_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// One committed turn of `key` on `replica`.
async fn one_turn(store: &RedisLedgerStore, replica: &ReplicaId, key: SessionKey) {
    let begin = BeginRequest {
        key,
        replica: replica.clone(),
        turn_seq: None,
        cached_version: None,
        lease_ttl: Duration::from_secs(30),
        state_ttl: Duration::from_secs(24 * 3600),
        reclaim_own_lease: false,
        input_digest: None,
    };
    let BeginOutcome::Granted { lease, .. } = store.begin(&begin).await.unwrap() else {
        panic!("not granted");
    };
    let commit = CommitRequest {
        expected_version: lease.version,
        lease,
        payload: Bytes::from_static(b"{\"notes\":\"a bench session\"}"),
        workspace: None,
        reply: Bytes::from_static(b"ok"),
        state_ttl: Duration::from_secs(24 * 3600),
        started_at_ms: turn_record::now_ms(),
        input_digest: "in".into(),
        input: None,
    };
    assert!(matches!(
        store.commit(&commit).await.unwrap(),
        CommitOutcome::Committed { .. }
    ));
}

/// Runs turns on `sessions` with `clients` concurrent clients for `for_`:
/// (turns, this process's CPU per turn).
async fn turn_loop(
    store: &RedisLedgerStore,
    replica: &ReplicaId,
    sessions: usize,
    clients: usize,
    for_: Duration,
) -> (u64, Duration) {
    let done = Arc::new(AtomicU64::new(0));
    let cpu_before = process_cpu(std::process::id());
    let deadline = Instant::now() + for_;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (store, replica, done) = (store.clone(), replica.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while Instant::now() < deadline {
                let key = SessionKey::new(TENANT, &format!("s-{:06}", i % sessions)).unwrap();
                one_turn(&store, &replica, key).await;
                done.fetch_add(1, Ordering::Relaxed);
                i += clients;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let turns = done.load(Ordering::Relaxed);
    let cpu = process_cpu(std::process::id()) - cpu_before;
    (turns, cpu / turns.max(1) as u32)
}

/// user + system CPU of `pid` so far.
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // Linux reports clock ticks of 1/100 s.
    Duration::from_millis(ticks * 10)
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The dashboard alone: serves on `BATON_BENCH_PORT` until killed.
async fn serve() {
    let redis = std::env::var("BATON_BENCH_REDIS").unwrap();
    let database = std::env::var("BATON_BENCH_DATABASE").unwrap();
    let port: u16 = std::env::var("BATON_BENCH_PORT").unwrap().parse().unwrap();
    let catalog = baton_ledger::RedisCatalog::connect(&redis, &database)
        .await
        .unwrap();
    let dashboard = Arc::new(baton_web::server::Dashboard::new(
        Arc::new(catalog),
        None,
        baton_web::server::Sidecars::new(None, baton_web::server::Vouch::Networks(Vec::new())),
        baton_web::server::Auth::open(),
        baton_web::server::Audit::in_memory(),
    ));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    axum::serve(
        baton_web::server::no_delay(listener),
        baton_web::server::router(dashboard),
    )
    .await
    .unwrap();
}

struct PageFigures {
    p50: Duration,
    p99: Duration,
    cpu: Duration,
    bytes: usize,
}

async fn measure_page(http: &reqwest::Client, base: &str, path: &str, server: u32) -> PageFigures {
    let url = format!("{base}{path}");
    // Warm: connections, statement caches.
    for _ in 0..3 {
        http.get(&url).send().await.unwrap().bytes().await.unwrap();
    }
    let cpu_before = process_cpu(server);
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..REQUESTS {
        let started = Instant::now();
        let answer = http.get(&url).send().await.unwrap();
        assert!(answer.status().is_success(), "{url}: {}", answer.status());
        bytes = answer.bytes().await.unwrap().len();
        times.push(started.elapsed());
    }
    let cpu = (process_cpu(server) - cpu_before) / REQUESTS as u32;
    times.sort();
    PageFigures {
        p50: times[times.len() / 2],
        p99: times[times.len() * 99 / 100],
        cpu,
        bytes,
    }
}

/// Keeps live sessions page `i` open, each at its own place in the list
/// (so none shares another's reads): reads its event stream until aborted.
fn open_live_page(base: &str, i: usize) -> tokio::task::JoinHandle<()> {
    let url =
        format!("{base}/dashboard/live/sessions?after_tenant={TENANT}&after_session=s-0{i}0000");
    tokio::spawn(async move {
        let mut answer = reqwest::get(&url).await.unwrap();
        while let Ok(Some(_)) = answer.chunk().await {}
    })
}

#[tokio::main]
async fn main() {
    if std::env::var("BATON_BENCH_SERVE").is_ok() {
        serve().await;
        return;
    }
    let sessions = sessions_wanted();
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let database = postgres.create_database("baton");
    let store = RedisLedgerStore::connect(&redis.url(), &database)
        .await
        .unwrap();
    let replica = ReplicaId::new("bench-1-aaaaaa").unwrap();
    store
        .heartbeat(&replica, Duration::from_secs(3600))
        .await
        .unwrap();

    println!("loading {sessions} sessions through the turn path…");
    let started = Instant::now();
    let (loaded, _) = {
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        let clients = 32;
        for c in 0..clients {
            let (store, replica, done) = (store.clone(), replica.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = c;
                while i < sessions {
                    let key = SessionKey::new(TENANT, &format!("s-{i:06}")).unwrap();
                    one_turn(&store, &replica, key).await;
                    done.fetch_add(1, Ordering::Relaxed);
                    i += clients;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        one_turn(&store, &replica, SessionKey::new(TENANT, BIG).unwrap()).await;
        (done.load(Ordering::Relaxed), ())
    };
    let pool = sqlx::PgPool::connect(&database).await.unwrap();
    // Until the shipper has put every session in the ledger.
    let wanted = loaded as i64 + 1;
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
            .fetch_one(&pool)
            .await
            .unwrap();
        if n >= wanted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "  {loaded} sessions in {:.1} s; adding the other turns with SQL…",
        started.elapsed().as_secs_f64()
    );
    sqlx::query(
        "INSERT INTO turns (tenant, session, turn_seq, version, replica, fence, input_digest, reply_digest, started_at_ms, committed_at_ms)
         SELECT s.tenant, s.session, g, g, s.last_replica, s.last_fence + g, 'in', 'out',
                s.last_turn_at_ms + g * 1000, s.last_turn_at_ms + g * 1000 + 40
         FROM sessions s, generate_series(2, CASE WHEN s.session = $1 THEN $2 ELSE $3 END) g",
    )
    .bind(BIG)
    .bind(BIG_TURNS)
    .bind(TURNS_PER_SESSION)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE sessions SET turn_count = CASE WHEN session = $1 THEN $2 ELSE $3 END")
        .bind(BIG)
        .bind(BIG_TURNS)
        .bind(TURNS_PER_SESSION)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    let turns: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .unwrap();
    println!("  ledger: {} sessions, {turns} turns", wanted);

    // The dashboard, alone in its process.
    let port = free_port();
    let mut server = std::process::Command::new(std::env::current_exe().unwrap())
        .env("BATON_BENCH_SERVE", "1")
        .env("BATON_BENCH_REDIS", redis.url())
        .env("BATON_BENCH_DATABASE", &database)
        .env("BATON_BENCH_PORT", port.to_string())
        .spawn()
        .unwrap();
    let pid = server.id();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let up = Instant::now();
    while http
        .get(format!("{base}/dashboard/signin"))
        .send()
        .await
        .is_err()
    {
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "the dashboard did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_idle = rss_mib(pid);

    println!();
    println!(
        "{:<52} {:>9} {:>9} {:>11} {:>9}",
        "page", "p50", "p99", "CPU/req", "HTML"
    );
    for (name, path) in [
        ("sessions, first page (100 rows)", "/dashboard".to_owned()),
        (
            "sessions, filtered by tenant and id prefix",
            format!("/dashboard?tenant={TENANT}&prefix=s-0999"),
        ),
        (
            "sessions, a page deep into the keyset",
            format!("/dashboard?after_tenant={TENANT}&after_session=s-090000"),
        ),
        (
            "sessions, filtered by replica",
            "/dashboard?replica=bench-1".to_owned(),
        ),
        (
            "a session with 10,000 turns (200 shown)",
            format!("/dashboard/sessions/{TENANT}/{BIG}"),
        ),
        ("replicas", "/dashboard/replicas".to_owned()),
    ] {
        let f = measure_page(&http, &base, &path, pid).await;
        println!(
            "{name:<52} {:>6.1} ms {:>6.1} ms {:>8.1} ms {:>6} KB",
            f.p50.as_secs_f64() * 1000.0,
            f.p99.as_secs_f64() * 1000.0,
            f.cpu.as_secs_f64() * 1000.0,
            f.bytes / 1024
        );
    }

    println!();
    let window = Duration::from_secs(
        std::env::var("BATON_BENCH_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    // Rounds in the order A B B A: the machine drifts (the ledger grows,
    // Postgres and the shipper slow down), and each side gets the same
    // share of it.
    let mut rounds: Vec<(&str, u64, Duration)> = Vec::new();
    let mut live_cpu = Duration::ZERO;
    for with_pages in [false, true, true, false] {
        if !with_pages {
            let (turns, cpu) = turn_loop(&store, &replica, sessions, 16, window).await;
            rounds.push(("no dashboard page open", turns, cpu));
            continue;
        }
        let pages: Vec<_> = (0..10).map(|i| open_live_page(&base, i)).collect();
        let server_cpu_before = process_cpu(pid);
        let (turns, cpu) = turn_loop(&store, &replica, sessions, 16, window).await;
        live_cpu += process_cpu(pid) - server_cpu_before;
        for p in pages {
            p.abort();
        }
        rounds.push(("10 live sessions pages open", turns, cpu));
    }
    println!(
        "{:<52} {:>12} {:>14}",
        "turn path (16 clients), rounds in order A B B A", "turns/s", "client CPU/turn"
    );
    for (name, turns, cpu) in rounds {
        println!(
            "{name:<52} {:>12.0} {:>11.1} µs",
            turns as f64 / window.as_secs_f64(),
            cpu.as_secs_f64() * 1e6
        );
    }
    println!(
        "dashboard CPU for the 10 live pages: {:.1} % of a core",
        live_cpu.as_secs_f64() / (2.0 * window.as_secs_f64()) * 100.0
    );
    println!();
    println!(
        "browser bundle: wasm {} KB + JS {} KB gzipped ({} KB + {} KB raw)",
        baton_web::server::assets::WASM_GZ.len() / 1024,
        baton_web::server::assets::JS_GZ.len() / 1024,
        baton_web::server::assets::WASM.len() / 1024,
        baton_web::server::assets::JS.len() / 1024,
    );
    println!(
        "dashboard RSS: {rss_idle:.1} MiB started, {:.1} MiB after the pages above",
        rss_mib(pid)
    );
    let _ = server.kill();
    let _ = server.wait();
}
