//! What a ledger sweep and a replica listing cost Redis when it holds many
//! keys that are not waiting to ship: the keyspace walk they used to do
//! (SCAN MATCH with the default COUNT, as `sessions_with_logs` and
//! `replicas` did until commit 522ccad) against the index reads
//! they do now, side by side on one Redis.
//!
//! ```text
//! cargo bench -p baton-ledger --bench sweep                 # 1,000,000 keys
//! BATON_BENCH_KEYS=200000 cargo bench -p baton-ledger --bench sweep
//! ```
//!
//! Figures per operation: commands Redis ran (`INFO commandstats`, script
//! internals included: each is a round trip's worth of work or less), Redis
//! CPU (`INFO cpu`, user + sys) and wall time. A replica swept once a
//! second, so Redis CPU per sweep times the replicas is the share of a core
//! the sweeps took.

use std::time::{Duration, Instant};

use ::redis::AsyncCommands as _;
use ::redis::aio::MultiplexedConnection;
use baton_ledger::RedisLedgerStore;
use baton_session::*;
use baton_testkit::{PostgresServer, RedisServer};
use bytes::Bytes;

/// Commands run and CPU seconds used by Redis so far.
async fn redis_work(admin: &mut MultiplexedConnection) -> (u64, f64) {
    let stats: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .unwrap();
    let commands = stats
        .lines()
        .filter_map(|l| {
            let rest = l.split_once(":calls=")?.1;
            rest.split(',').next()?.parse::<u64>().ok()
        })
        .sum();
    let cpu: String = ::redis::cmd("INFO")
        .arg("cpu")
        .query_async(admin)
        .await
        .unwrap();
    let seconds = cpu
        .lines()
        .filter(|l| l.starts_with("used_cpu_user:") || l.starts_with("used_cpu_sys:"))
        .filter_map(|l| l.split_once(':')?.1.trim().parse::<f64>().ok())
        .sum();
    (commands, seconds)
}

struct Measured {
    commands: u64,
    redis_cpu: Duration,
    wall: Duration,
}

/// Runs `op` `runs` times; per-run averages. The two INFOs of a reading
/// are taken out of the command count.
async fn measure<F, Fut>(admin: &mut MultiplexedConnection, runs: u32, mut op: F) -> Measured
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let (c0, cpu0) = redis_work(admin).await;
    let started = Instant::now();
    for _ in 0..runs {
        op().await;
    }
    let wall = started.elapsed() / runs;
    let (c1, cpu1) = redis_work(admin).await;
    Measured {
        commands: (c1 - c0 - 2) / u64::from(runs),
        redis_cpu: Duration::from_secs_f64((cpu1 - cpu0).max(0.0) / f64::from(runs)),
        wall,
    }
}

/// The keyspace walk the sweep and the replica list used to make.
async fn scan_walk(conn: &mut MultiplexedConnection, pattern: &str) -> usize {
    let mut found = 0;
    let mut iter: ::redis::AsyncIter<String> = conn.scan_match(pattern).await.unwrap();
    while let Some(item) = iter.next_item().await {
        item.unwrap();
        found += 1;
    }
    found
}

fn row(what: &str, m: &Measured) {
    println!(
        "| {what} | {} | {:.2} | {:.2} |",
        m.commands,
        m.redis_cpu.as_secs_f64() * 1000.0,
        m.wall.as_secs_f64() * 1000.0
    );
}

/// One committed turn on each of `sessions`.
async fn commit_once_each(writer: &RedisLedgerStore, replica: &ReplicaId, sessions: &[SessionKey]) {
    for key in sessions {
        let begin = BeginRequest {
            key: key.clone(),
            replica: replica.clone(),
            turn_seq: None,
            cached_version: None,
            lease_ttl: Duration::from_secs(60),
            state_ttl: Duration::from_secs(3600),
            reclaim_own_lease: false,
            input_digest: None,
        };
        let BeginOutcome::Granted { lease, .. } = writer.begin(&begin).await.unwrap() else {
            panic!("no grant");
        };
        let commit = CommitRequest {
            expected_version: lease.version,
            lease,
            payload: Bytes::from_static(b"{}"),
            workspace: None,
            reply: Bytes::from_static(b"ok"),
            state_ttl: Duration::from_secs(3600),
            started_at_ms: 1,
            input_digest: "in".into(),
            input: None,
        };
        writer.commit(&commit).await.unwrap();
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let keys: usize = std::env::var("BATON_BENCH_KEYS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(1_000_000);
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let database = postgres.create_database("sweep_bench");
    let mut admin = ::redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Keys that are not waiting to ship: other applications' keys and idle
    // sessions' states look the same to a SCAN MATCH.
    let filled = Instant::now();
    for start in (0..keys).step_by(10_000) {
        let mut pipe = ::redis::pipe();
        let end = (start + 10_000).min(keys);
        let pairs: Vec<(String, u8)> = (start..end).map(|i| (format!("other:{i}"), 1)).collect();
        for part in pairs.chunks(500) {
            pipe.mset(part).ignore();
        }
        let () = pipe.query_async(&mut admin).await.unwrap();
    }
    eprintln!("{keys} keys written in {:?}", filled.elapsed());

    // 100 sessions with a record each, from a replica whose shipper never
    // ran; a second store sweeps.
    let writer = RedisLedgerStore::connect_without_shipper(&redis.url(), &database)
        .await
        .unwrap();
    let replica = ReplicaId::new("bench").unwrap();
    writer
        .heartbeat(&replica, Duration::from_secs(600))
        .await
        .unwrap();
    let sessions: Vec<SessionKey> = (0..100)
        .map(|i| SessionKey::new("bench", &format!("s{i}")).unwrap())
        .collect();
    commit_once_each(&writer, &replica, &sessions).await;
    let sweeper = RedisLedgerStore::connect_without_shipper(&redis.url(), &database)
        .await
        .unwrap();
    let mut conn = admin.clone();
    let walk_logs = measure(&mut admin, 3, || {
        let mut conn = conn.clone();
        async move {
            assert!(scan_walk(&mut conn, "baton:{*}:log").await >= 100);
        }
    })
    .await;
    let walk_replicas = measure(&mut admin, 3, || {
        let mut conn = conn.clone();
        async move {
            assert_eq!(scan_walk(&mut conn, "baton:hb:*").await, 1);
        }
    })
    .await;
    // The index: entries become the sweep's after SWEEP_AFTER. The first
    // sweep of a Redis also backfills (a SCAN, like the walk above).
    tokio::time::sleep(baton_ledger::SWEEP_AFTER).await;
    let backfill = measure(&mut admin, 1, || async {
        assert_eq!(sweeper.sweep_now().await.unwrap(), 100);
    })
    .await;
    commit_once_each(&writer, &replica, &sessions).await;
    tokio::time::sleep(baton_ledger::SWEEP_AFTER).await;
    let ship = measure(&mut admin, 1, || async {
        assert_eq!(sweeper.sweep_now().await.unwrap(), 100);
    })
    .await;
    // The entries of the shipped (now empty) logs leave the index.
    let unindex = measure(&mut admin, 1, || async {
        sweeper.sweep_now().await.unwrap();
    })
    .await;
    let idle = measure(&mut admin, 20, || async {
        sweeper.sweep_now().await.unwrap();
    })
    .await;
    // The known-session index (redis/known.rs), which `sweep` maintains
    // after shipping: marking the 100 sessions the ledger knows for this
    // Redis run, once, then a check per sweep.
    let known_backfill = measure(&mut admin, 1, || async {
        assert!(sweeper.maintain_known_index().await.unwrap());
    })
    .await;
    let known_idle = measure(&mut admin, 20, || async {
        assert!(sweeper.maintain_known_index().await.unwrap());
    })
    .await;
    let list = measure(&mut admin, 20, || async {
        assert_eq!(sweeper.replicas().await.unwrap().len(), 1);
    })
    .await;
    let left: u64 = conn
        .zcard(baton_store_redis::UNSHIPPED_INDEX)
        .await
        .unwrap();
    assert_eq!(left, 0, "every shipped session left the index");

    println!("\n{keys} keys in Redis, 100 sessions with unshipped records\n");
    println!("| operation | Redis commands | Redis CPU ms | wall ms |");
    println!("|---|---|---|---|");
    row(
        "before: sweep's keyspace walk (SCAN MATCH baton:{*}:log)",
        &walk_logs,
    );
    row(
        "before: replica list's walk (SCAN MATCH baton:hb:*)",
        &walk_replicas,
    );
    row(
        "after: first sweep of a Redis (one-time backfill + shipping 100 sessions)",
        &backfill,
    );
    row("after: sweep shipping 100 sessions", &ship);
    row("after: sweep dropping their 100 index entries", &unindex);
    row("after: idle sweep", &idle);
    row(
        "after: known-session index, first sweep of a Redis run (100 ledger sessions marked)",
        &known_backfill,
    );
    row("after: known-session index, check per sweep", &known_idle);
    row("after: replica list", &list);
}
