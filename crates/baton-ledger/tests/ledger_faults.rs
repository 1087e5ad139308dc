//! The ledger under faults, with real servers: Redis restarted empty, Postgres
//! stopped during turns, a replica gone right after its commits, the script
//! cache flushed. Those that restart no Redis run on a Redis Cluster too
//! (`on_a_cluster_*`); a cluster's own faults, a master killed and a slot
//! moved under load, are in `cluster.rs`.

use baton_session_contract::cases;
mod ledgered;

use std::time::Duration;

use baton_ledger::PostgresLedger;
use baton_ledger::RedisLedgerStore;
use baton_session::durable::ShipBatch;
use baton_session::*;
use baton_store_redis::RedisStore;
use baton_testkit::{PostgresServer, RedisServer, wait_until_async};
use cases::{begin_req, commit_req, granted, key, replica, turn};

const SHIPPED_WITHIN: Duration = Duration::from_secs(10);

/// After a Redis restart the first commands fail (Unavailable) while the
/// connection is re-established; the replica's heartbeat loop retries.
async fn reconnected<S: TurnStore>(store: &S, id: &str) -> ReplicaId {
    let replica = ReplicaId::new(id).unwrap();
    wait_until_async(
        Duration::from_secs(10),
        "the heartbeat to reach the restarted Redis",
        || async { store.heartbeat(&replica, cases::LONG).await.is_ok() },
    )
    .await;
    replica
}

async fn wait_for_ledger(ledger: &PostgresLedger, key: &SessionKey, rows: u64) {
    wait_until_async(
        SHIPPED_WITHIN,
        &format!("{rows} ledger rows for {key}"),
        || async { ledger.turn_count(key).await.unwrap_or(0) == rows },
    )
    .await;
}

/// Redis for a fault test: a private server, or a namespace of its own on
/// the Redis Cluster (3 masters, a replica each) this binary shares.
enum Redis {
    Single(RedisServer),
    Cluster(String),
}

impl Redis {
    fn single() -> Self {
        Self::Single(RedisServer::start())
    }

    fn cluster() -> Self {
        ledgered::cluster();
        Self::Cluster(ledgered::namespace())
    }

    fn url(&self) -> String {
        match self {
            Self::Single(server) => server.url(),
            Self::Cluster(_) => ledgered::cluster().url(),
        }
    }

    fn namespace(&self) -> &str {
        match self {
            Self::Single(_) => "",
            Self::Cluster(namespace) => namespace,
        }
    }

    async fn store(&self) -> RedisStore {
        let space = baton_store_redis::KeySpace::new(self.namespace());
        RedisStore::connect_in(&self.url(), space).await.unwrap()
    }

    async fn ledgered(&self) -> RedisLedgerStore {
        RedisLedgerStore::connect_in(&self.url(), &ledgered::database(), self.namespace())
            .await
            .unwrap()
    }

    async fn without_shipper(&self) -> RedisLedgerStore {
        RedisLedgerStore::connect_without_shipper_in(
            &self.url(),
            &ledgered::database(),
            self.namespace(),
        )
        .await
        .unwrap()
    }

    /// Runs `cmd` on the server, or on every master of the cluster.
    async fn on_every_master(&self, cmd: &::redis::Cmd) {
        let urls = match self {
            Self::Single(server) => vec![server.url()],
            Self::Cluster(_) => ledgered::cluster()
                .shards()
                .iter()
                .map(|shard| format!("redis://127.0.0.1:{}/", shard.master_port))
                .collect(),
        };
        for url in urls {
            let mut admin = baton_testkit::redis_admin(&url).await;
            let () = cmd.query_async(&mut admin).await.unwrap();
        }
    }
}

/// A fault test on one Redis server and again on the Redis Cluster.
macro_rules! on_both {
    ($body:ident: $single:ident, $cluster:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $single() {
            $body(Redis::single()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $cluster() {
            $body(Redis::cluster()).await;
        }
    };
}

on_both!(every_committed_turn_reaches_the_ledger_once:
    every_committed_turn_reaches_the_ledger_exactly_once,
    on_a_cluster_every_committed_turn_reaches_the_ledger_exactly_once);

async fn every_committed_turn_reaches_the_ledger_once(redis: Redis) {
    let store = redis.ledgered().await;
    let a = replica(&store, "a").await;
    let k = key("ledger");
    for i in 1..=10 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    wait_for_ledger(store.ledger(), &k, 10).await;
    // A second sweep ships nothing more and changes nothing.
    store.sweep().await.unwrap();
    assert_eq!(store.ledger().turn_count(&k).await.unwrap(), 10);
    let known = store.ledger().session(&k).await.unwrap().unwrap();
    assert_eq!(
        (known.last_version, known.last_turn_seq, known.turn_count),
        (10, 10, 10)
    );
    let copy = known.durable.unwrap();
    assert_eq!((copy.version, copy.payload.as_ref()), (10, &b"t10"[..]));
    let turns = store.ledger().turns(&k, 3).await.unwrap();
    assert_eq!(
        turns.iter().map(|t| t.turn_seq).collect::<Vec<_>>(),
        [10, 9, 8]
    );
    assert!(
        turns
            .iter()
            .all(|t| t.replica == "a" && t.committed_at_ms >= t.started_at_ms)
    );
}

on_both!(many_sessions_ship_together:
    many_sessions_ship_together_each_turn_once,
    on_a_cluster_many_sessions_ship_together_each_turn_once);

/// On a cluster the 301 sessions fall in most of the 1,024 buckets, and
/// each master's are shipped and acknowledged in one request.
async fn many_sessions_ship_together(redis: Redis) {
    // Turns committed with nobody shipping: one session with a log longer
    // than a shipping batch (256), and 300 sessions of 2 turns — more than
    // one shipping round holds.
    let writer = redis.store().await;
    let a = replica(&writer, "a").await;
    let long = key("long");
    for i in 1..=300 {
        turn(&writer, &long, &a, &format!("t{i}")).await;
    }
    let keys: Vec<_> = (0..300).map(|n| key(&format!("s{n}"))).collect();
    let tasks: Vec<_> = keys
        .iter()
        .map(|k| {
            let (writer, a, k) = (writer.clone(), a.clone(), k.clone());
            tokio::spawn(async move {
                turn(&writer, &k, &a, "one").await;
                turn(&writer, &k, &a, "two").await;
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Without the background shipper: its sweep would race the calls below
    // for the same records and blur who shipped how many.
    let shipper = redis.without_shipper().await;
    let mut all = keys.clone();
    all.push(long.clone());
    // Twice, as two replicas might: the second round finds nothing left.
    let first = shipper.ship_many(&all).await.unwrap();
    let second = shipper.ship_many(&all).await.unwrap();
    assert_eq!((first, second), (300 + 600, 0));
    let ledger = shipper.ledger();
    assert_eq!(ledger.turn_count(&long).await.unwrap(), 300);
    let known = ledger.session(&long).await.unwrap().unwrap();
    assert_eq!((known.last_version, known.turn_count), (300, 300));
    for k in &keys {
        let known = ledger.session(k).await.unwrap().unwrap();
        assert_eq!((known.last_version, known.turn_count), (2, 2), "{k}");
        assert_eq!(known.durable.unwrap().payload.as_ref(), b"two");
    }
}

/// Shipping batches of the same new sessions, in opposite orders, as two
/// replicas' shippers (or a test and a sweep) can: Postgres takes row locks
/// in the order rows arrive, so the ledger must order them itself or the two
/// transactions wait on each other and one is aborted as a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shippers_holding_sessions_in_opposite_orders_both_commit() {
    let ledger = PostgresLedger::connect(&ledgered::database())
        .await
        .unwrap();
    let record = |k: &SessionKey, turn_seq: u64| TurnRecord {
        tenant: k.tenant.to_string(),
        session: k.session.to_string(),
        turn_seq,
        version: turn_seq,
        replica: "a".into(),
        fence: 1,
        input_digest: "i".into(),
        reply_digest: "r".into(),
        workspace: None,
        started_at_ms: 1,
        committed_at_ms: 2,
        input: None,
        reply: None,
        interrupted: false,
    };
    for round in 0..5 {
        let keys: Vec<_> = (0..200).map(|n| key(&format!("r{round}-s{n}"))).collect();
        let batches: Vec<_> = keys
            .iter()
            .map(|k| ShipBatch {
                key: k.clone(),
                records: (1..=3).map(|seq| record(k, seq)).collect(),
                durable: None,
                run: None,
            })
            .collect();
        let reversed: Vec<_> = batches
            .iter()
            .rev()
            .map(|b| ShipBatch {
                records: b.records.iter().rev().cloned().collect(),
                ..b.clone()
            })
            .collect();
        let (forward, backward) =
            tokio::join!(ledger.record_many(&batches), ledger.record_many(&reversed));
        forward.unwrap();
        backward.unwrap();
        for k in &keys {
            let known = ledger.session(k).await.unwrap().unwrap();
            assert_eq!((known.last_version, known.turn_count), (3, 3), "{k}");
        }
    }
}

on_both!(a_replica_gone_after_its_commits:
    a_replica_gone_right_after_its_commits_loses_no_ledger_row,
    on_a_cluster_a_replica_gone_right_after_its_commits_loses_no_ledger_row);

async fn a_replica_gone_after_its_commits(redis: Redis) {
    // The first replica commits (indexing its sessions as unshipped, as
    // every sidecar's commit does) and never ships. (Redis alone, which
    // indexes nothing, is shipped by a one-server sweep's SCAN of logs
    // written before the index: a cluster has none.)
    let gone = redis.without_shipper().await;
    let a = replica(&gone, "a").await;
    let k = key("orphaned");
    for i in 1..=5 {
        turn(&gone, &k, &a, &format!("t{i}")).await;
    }
    drop(gone);
    // Any other replica's sweep ships the leftovers.
    let other = redis.ledgered().await;
    wait_for_ledger(other.ledger(), &k, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_loses_everything_versions_and_fences_continue_from_the_ledger() {
    let (mut redis, store) = ledgered::store().await;
    let a = replica(&store, "a").await;
    let k = key("amnesia");
    for i in 1..=3 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    wait_for_ledger(store.ledger(), &k, 3).await;
    let fence_before = store.session(&k).await.unwrap().unwrap().fence;

    redis.restart(); // no persistence: Redis comes back empty
    let a = reconnected(&store, "a").await;
    let (lease, state) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref()),
        (3, Some(&b"t3"[..])),
        "restored, not restarted at 0"
    );
    assert_eq!(lease.turn_seq, 4);
    assert!(
        lease.fence > fence_before,
        "fence went backwards: {} <= {fence_before}",
        lease.fence
    );
    let outcome = store.commit(&commit_req(&lease, "t4", "r")).await.unwrap();
    assert_eq!(outcome, CommitOutcome::Committed { version: 4 });
    wait_for_ledger(store.ledger(), &k, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_without_a_durable_copy_is_state_lost() {
    let (redis, store) = ledgered::store().await;
    let a = replica(&store, "a").await;
    let k = key("no-copy");
    // The ledger knows turns of this session but holds no copy of its state;
    // Redis lost the state, not the marker its commits left (which every
    // turn record the ledger holds came with: see redis/known.rs).
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let () = ::redis::cmd("SET")
        .arg(baton_store_redis::SessionKeys::new(&k).known)
        .arg("1")
        .query_async(&mut admin)
        .await
        .unwrap();
    let record = TurnRecord {
        tenant: "acme".into(),
        session: "no-copy".into(),
        turn_seq: 1,
        version: 1,
        replica: "a".into(),
        fence: 7,
        input_digest: "i".into(),
        reply_digest: "r".into(),
        workspace: None,
        started_at_ms: 1,
        committed_at_ms: turn_record::now_ms(),
        input: None,
        reply: None,
        interrupted: false,
    };
    store
        .ledger()
        .record(&ShipBatch {
            key: k.clone(),
            records: vec![record],
            durable: None,
            run: None,
        })
        .await
        .unwrap();
    let outcome = store.begin(&begin_req(&k, &a, None)).await.unwrap();
    assert_eq!(outcome, BeginOutcome::StateLost { last_version: 1 });
    assert!(
        store.session(&k).await.unwrap().is_none(),
        "nothing was created at version 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_commit_while_postgres_is_down_and_reach_the_ledger_once_it_is_back() {
    let mut postgres = PostgresServer::start();
    let url = postgres.create_database("g8");
    let redis = RedisServer::start();
    let store = RedisLedgerStore::connect(&redis.url(), &url).await.unwrap();
    let a = replica(&store, "a").await;
    let k = key("pg-down");
    turn(&store, &k, &a, "t1").await;
    wait_for_ledger(store.ledger(), &k, 1).await;

    postgres.stop();
    for i in 2..=6 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    assert!(
        store.ledger().turn_count(&k).await.is_err(),
        "Postgres should be down"
    );
    postgres.start_again();
    wait_for_ledger(store.ledger(), &k, 6).await;
    let known = store.ledger().session(&k).await.unwrap().unwrap();
    assert_eq!((known.last_version, known.turn_count), (6, 6));
}

on_both!(a_flushed_script_cache_is_reloaded:
    a_flushed_script_cache_is_reloaded_not_mistaken_for_an_outcome,
    on_a_cluster_a_flushed_script_cache_is_reloaded_not_mistaken_for_an_outcome);

async fn a_flushed_script_cache_is_reloaded(redis: Redis) {
    let store = redis.without_shipper().await;
    let a = replica(&store, "a").await;
    let keys: Vec<_> = (0..20).map(|n| key(&format!("noscript{n}"))).collect();
    for k in &keys {
        turn(&store, k, &a, "t1").await;
    }
    let flush = ::redis::cmd("SCRIPT").arg("FLUSH").clone();
    redis.on_every_master(&flush).await;
    let (lease, state) = granted(&store, &begin_req(&keys[0], &a, None)).await;
    assert_eq!(state.version, 1);
    redis.on_every_master(&flush).await;
    assert_eq!(
        store.commit(&commit_req(&lease, "t2", "r")).await.unwrap(),
        CommitOutcome::Committed { version: 2 }
    );
    // The shipper's acknowledgements (a script, many buckets at once) too.
    redis.on_every_master(&flush).await;
    assert_eq!(store.ship_many(&keys).await.unwrap(), 21);
    assert_eq!(store.ship_many(&keys).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_survive_a_redis_restart_with_persistence() {
    let mut redis = RedisServer::start_with(true);
    let store = RedisLedgerStore::connect(&redis.url(), &ledgered::database())
        .await
        .unwrap();
    let a = replica(&store, "a").await;
    let k = key("restart");
    turn(&store, &k, &a, "t1").await;
    wait_for_ledger(store.ledger(), &k, 1).await;
    redis.restart();
    // Whether AOF kept the last second or the ledger restores it, the
    // session continues at version 2 and the scripts are loaded again.
    let a = reconnected(&store, "a").await;
    assert_eq!(turn(&store, &k, &a, "t2").await, 2);
}

/// Redis acknowledges a commit before its persistence reaches the disk, so
/// after a crash it can come back with an older state than the one clients
/// were told about. Here it comes back from a snapshot taken at version 3,
/// while turns 4 and 5 were committed and shipped: the next turn must build
/// on version 5 from the ledger, never hand out version 4 a second time, and
/// a lease that was alive in the snapshot (taken over since) must not commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_back_with_an_older_state_is_caught_up_from_the_ledger() {
    let mut redis = RedisServer::start();
    let database = ledgered::database();
    let store = RedisLedgerStore::connect(&redis.url(), &database)
        .await
        .unwrap();
    // A client that will not heartbeat after the restart, so it goes on
    // taking the old Redis run for the current one (see RunView).
    let late = RedisLedgerStore::connect_without_shipper(&redis.url(), &database)
        .await
        .unwrap();
    let a = replica(&store, "a").await;
    let (k, other, behind) = (key("rewound"), key("untouched"), key("behind"));
    turn(&store, &other, &a, "o1").await;
    turn(&store, &behind, &a, "b1").await;
    for i in 1..=3 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    // A turn running when the snapshot is taken, taken over afterwards.
    let (stale, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let () = ::redis::cmd("SAVE").query_async(&mut admin).await.unwrap();
    let snapshot = redis.data_dir().join("dump.rdb");
    let older = redis.data_dir().join("older.rdb");
    std::fs::copy(&snapshot, &older).unwrap();
    store.revoke(&k).await.unwrap();
    for i in 4..=5 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    turn(&store, &behind, &a, "b2").await;
    for (session, version) in [(&k, 5), (&behind, 2)] {
        wait_until_async(SHIPPED_WITHIN, "the ledger's copy", || async {
            let known = store.ledger().session(session).await.unwrap();
            known
                .and_then(|s| s.durable)
                .is_some_and(|d| d.version == version)
        })
        .await;
    }
    let fence_before = store.session(&k).await.unwrap().unwrap().fence;

    redis.kill();
    std::fs::copy(&older, &snapshot).unwrap();
    redis.start_again();
    let a = reconnected(&store, "a").await;
    assert_eq!(
        store.session(&k).await.unwrap().unwrap().version,
        3,
        "Redis came back with the older state"
    );
    // The stale lease is alive again in that state; it still cannot commit.
    assert_eq!(
        store
            .commit(&commit_req(&stale, "zombie", "r"))
            .await
            .unwrap(),
        CommitOutcome::LeaseLost
    );
    let (lease, state) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref()),
        (5, Some(&b"t5"[..])),
        "the ledger's newer copy, not Redis's older one"
    );
    assert!(lease.fence > fence_before, "fences only grow");
    assert_eq!(
        store.commit(&commit_req(&lease, "t6", "r")).await.unwrap(),
        CommitOutcome::Committed { version: 6 }
    );
    wait_for_ledger(store.ledger(), &k, 6).await;
    // A session Redis kept whole is checked once and goes on as it was.
    assert_eq!(turn(&store, &other, &a, "o2").await, 2);

    // The late client's stale idea of the run lets it be granted the older
    // state, once; the commit asks Redis itself and refuses, and the client
    // learns the run, so its next begin finds the ledger's copy.
    let outcome = baton_testkit::poll_async(
        Duration::from_secs(10),
        "the late client to reach the restarted Redis",
        || async { late.begin(&begin_req(&behind, &a, None)).await.ok() },
    )
    .await;
    let BeginOutcome::Granted { lease, state } = outcome else {
        panic!("expected a grant, got {outcome:?}");
    };
    assert_eq!(state.version, 1, "granted on the older state");
    assert_eq!(
        late.commit(&commit_req(&lease, "zombie", "r"))
            .await
            .unwrap(),
        CommitOutcome::LeaseLost
    );
    let (lease, state) = granted(&late, &begin_req(&behind, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref()),
        (2, Some(&b"b2"[..]))
    );
    assert_eq!(
        late.commit(&commit_req(&lease, "b3", "r")).await.unwrap(),
        CommitOutcome::Committed { version: 3 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_back_after_its_state_ttl_keeps_counting() {
    let (_redis, store) = ledgered::store().await;
    let a = replica(&store, "a").await;
    let k = key("returning");
    let ttl = Duration::from_millis(300);
    let begin = BeginRequest {
        state_ttl: ttl,
        ..begin_req(&k, &a, None)
    };
    let (lease, _) = granted(&store, &begin).await;
    store
        .commit(&CommitRequest {
            state_ttl: ttl,
            ..commit_req(&lease, "old", "r")
        })
        .await
        .unwrap();
    wait_for_ledger(store.ledger(), &k, 1).await;
    wait_until_async(Duration::from_secs(5), "the state to expire", || async {
        store.session(&k).await.unwrap().is_none()
    })
    .await;
    // Emptied under a new version (see RedisLedgerStore::recover); the
    // turnSeqs go on from the ledger's.
    let (lease, state) = granted(&store, &begin).await;
    assert_eq!(
        (state.version, lease.turn_seq, state.payload.as_deref()),
        (2, 2, Some(&b""[..]))
    );
    let outcome = store
        .commit(&CommitRequest {
            state_ttl: ttl,
            ..commit_req(&lease, "new", "r")
        })
        .await
        .unwrap();
    assert_eq!(outcome, CommitOutcome::Committed { version: 3 });
    wait_for_ledger(store.ledger(), &k, 2).await;
    let turns = store.ledger().turns(&k, 10).await.unwrap();
    assert_eq!(
        turns
            .iter()
            .map(|t| (t.turn_seq, t.version))
            .collect::<Vec<_>>(),
        [(2, 3), (1, 1)]
    );
}

/// An uncontended turn on an existing session is two Redis round trips: a
/// pipeline of the begin script and a GET of the payload, then a pipeline of
/// a PSETEX staging the new payload and the commit script. Counted with
/// MONITOR, which marks the commands a script runs with "lua]"; no other
/// command is sent, so nothing reads then deletes or expires outside a script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_turn_is_two_round_trips() {
    use std::io::{BufRead, BufReader, Write};
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let a = replica(&store, "a").await;
    let k = key("two-trips");
    turn(&store, &k, &a, "t1").await;

    let mut monitor = std::net::TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
    monitor.write_all(b"MONITOR\r\n").unwrap();
    let mut lines = BufReader::new(monitor.try_clone().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "+OK");
    let seen = std::thread::spawn(move || {
        let mut top_level = Vec::new();
        for line in lines.map_while(Result::ok) {
            if line.contains("\"ECHO\" \"end-of-turn\"") {
                break;
            }
            if !line.contains("lua]") {
                top_level.push(line);
            }
        }
        top_level
    });
    turn(&store, &k, &a, "t2").await;
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let _: String = ::redis::cmd("ECHO")
        .arg("end-of-turn")
        .query_async(&mut admin)
        .await
        .unwrap();
    let top_level = seen.join().unwrap();
    let commands: Vec<&str> = top_level
        .iter()
        .map(|l| l.split('"').nth(1).unwrap_or_default())
        .collect();
    assert_eq!(
        commands,
        ["EVALSHA", "GET", "PSETEX", "EVALSHA"],
        "{top_level:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_log_does_not_hold_back_other_sessions() {
    let (redis, store) = ledgered::store().await;
    let a = replica(&store, "a").await;
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let broken = baton_store_redis::SessionKeys::new(&key("broken")).log;
    let () = ::redis::pipe()
        .zadd(baton_store_redis::UNSHIPPED_INDEX, "acme:broken", 0)
        .ignore()
        .rpush(&broken, "not a turn record")
        .ignore()
        .query_async(&mut admin)
        .await
        .unwrap();
    let k = key("healthy");
    for i in 1..=3 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    store.sweep().await.unwrap();
    wait_for_ledger(store.ledger(), &k, 3).await;
}

/// The shipper drops from the log exactly the records it stored, not every
/// record up to the highest turnSeq it shipped. Redis that came back with an
/// older state uses turnSeqs again, so a record nobody shipped may carry a
/// turnSeq no higher than one just shipped; it must still reach the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_below_the_highest_shipped_turn_seq_is_still_shipped() {
    let redis = RedisServer::start();
    let url = ledgered::database();
    let store = RedisLedgerStore::connect(&redis.url(), &url).await.unwrap();
    let k = key("reused");
    let log = baton_store_redis::SessionKeys::new(&k).log;
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let record = |turn_seq: u64, fence: u64| {
        serde_json::to_string(&TurnRecord {
            tenant: "acme".into(),
            session: "reused".into(),
            turn_seq,
            version: turn_seq,
            replica: "a".into(),
            fence,
            input_digest: "i".into(),
            reply_digest: "r".into(),
            workspace: None,
            started_at_ms: 1,
            committed_at_ms: turn_record::now_ms(),
            input: None,
            reply: None,
            interrupted: false,
        })
        .unwrap()
    };

    // Hold the ledger's turn table, so the replica's shipper reads the log
    // and then waits to store what it read.
    let pg = sqlx::PgPool::connect(&url).await.unwrap();
    let mut hold = pg.begin().await.unwrap();
    sqlx::query("LOCK TABLE turns IN EXCLUSIVE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    // Written as a commit writes it: indexed, then logged.
    let () = ::redis::pipe()
        .zadd(baton_store_redis::UNSHIPPED_INDEX, "acme:reused", 0)
        .ignore()
        .rpush(&log, record(5, 500))
        .ignore()
        .query_async(&mut admin)
        .await
        .unwrap();
    wait_until_async(
        SHIPPED_WITHIN,
        "the shipper to wait for the ledger",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'turns'::regclass
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_one(&pg)
            .await
            .unwrap();
            waiting > 0
        },
    )
    .await;

    // Meanwhile Redis comes back with an older state: its log holds turn 3,
    // committed under another fence and never shipped.
    let () = ::redis::pipe()
        .atomic()
        .del(&log)
        .rpush(&log, record(3, 300))
        .query_async(&mut admin)
        .await
        .unwrap();
    hold.rollback().await.unwrap();

    // The shipper stores turn 5 and acknowledges it: turn 3 stays in the log
    // and is shipped next.
    wait_until_async(SHIPPED_WITHIN, "turn 3 in the ledger", || async {
        store.ledger().turn_count(&k).await.unwrap_or(0) == 2
    })
    .await;
    let turns = store.ledger().turns(&k, 10).await.unwrap();
    assert_eq!(
        turns
            .iter()
            .map(|t| (t.turn_seq, t.fence))
            .collect::<Vec<_>>(),
        [(5, 500), (3, 300)]
    );
    wait_until_async(SHIPPED_WITHIN, "the log to be emptied", || async {
        let left: u64 = ::redis::cmd("LLEN")
            .arg(&log)
            .query_async(&mut admin.clone())
            .await
            .unwrap();
        left == 0
    })
    .await;
}

/// A shipper that read a session's records in one Redis run, and is held up
/// (here on another session's row lock) until a replica has checked the
/// session against the ledger in the next run, must not land them: the
/// ledger would vouch for the older run's state, which the check replaced
/// with a history of its own. On a cluster this is a master failing over to
/// a lagging replica; here Redis comes back from an older snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shipper_held_up_across_a_restart_cannot_make_the_ledger_vouch_for_the_older_run() {
    let mut redis = RedisServer::start();
    let database = ledgered::database();
    let store = RedisLedgerStore::connect_without_shipper(&redis.url(), &database)
        .await
        .unwrap();
    let held = RedisLedgerStore::connect_without_shipper(&redis.url(), &database)
        .await
        .unwrap();
    let a = replica(&store, "a").await;
    // "bait" sorts before "victim": the held shipper locks its row first.
    let (bait, victim) = (key("bait"), key("victim"));
    turn(&store, &bait, &a, "b1").await;
    for i in 1..=3 {
        turn(&store, &victim, &a, &format!("t{i}")).await;
    }
    store
        .ship_many(&[bait.clone(), victim.clone()])
        .await
        .unwrap();
    // Redis's snapshot: the victim at 3, everything shipped.
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let () = ::redis::cmd("SAVE").query_async(&mut admin).await.unwrap();
    let snapshot = redis.data_dir().join("dump.rdb");
    let older = redis.data_dir().join("older.rdb");
    std::fs::copy(&snapshot, &older).unwrap();
    // This run goes on: the victim's turns 4 and 5, the bait's 2, unshipped.
    for i in 4..=5 {
        turn(&store, &victim, &a, &format!("t{i}")).await;
    }
    turn(&store, &bait, &a, "b2").await;

    // Hold the bait's ledger row: the shipper reads both sessions from this
    // run, then waits.
    let pg = sqlx::PgPool::connect(&database).await.unwrap();
    let mut hold = pg.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE session = 'bait' FOR UPDATE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let shipping = {
        let keys = [bait.clone(), victim.clone()];
        tokio::spawn(async move { held.ship_many(&keys).await })
    };
    wait_until_async(
        SHIPPED_WITHIN,
        "the shipper to wait on the row lock",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND datname = current_database()",
            )
            .fetch_one(&pg)
            .await
            .unwrap();
            waiting > 0
        },
    )
    .await;

    // Redis crashes and comes back from the snapshot, as another run.
    redis.kill();
    std::fs::copy(&older, &snapshot).unwrap();
    redis.start_again();
    let a = reconnected(&store, "a").await;
    // The next turn checks the victim against the ledger, which is at 3 (the
    // held shipper has not landed): this run goes on from 3, with a turn 4
    // of its own.
    let (lease, state) = granted(&store, &begin_req(&victim, &a, None)).await;
    assert_eq!(state.version, 3);
    assert_eq!(
        store
            .commit(&commit_req(&lease, "other-4", "r"))
            .await
            .unwrap(),
        CommitOutcome::Committed { version: 4 }
    );

    // The held shipper lands now. Its ack reaches the new run or fails with
    // the restart; either way what it read went with the old run.
    hold.rollback().await.unwrap();
    let _ = tokio::time::timeout(SHIPPED_WITHIN, shipping)
        .await
        .expect("the held shipper finishes");
    store.ship(&victim).await.unwrap();
    let known = store.ledger().session(&victim).await.unwrap().unwrap();
    let durable = known.durable.unwrap();
    assert_eq!(
        (
            known.last_version,
            durable.version,
            durable.payload.as_ref()
        ),
        (4, 4, &b"other-4"[..]),
        "the ledger follows this run's turn 4, not the old run's turns 4 and 5"
    );
    let turns = store.ledger().turns(&victim, 10).await.unwrap();
    assert_eq!(
        turns
            .iter()
            .map(|t| (t.turn_seq, t.fence == lease.fence))
            .collect::<Vec<_>>(),
        [(4, true), (3, false), (2, false), (1, false)]
    );
    // The bait was not checked in the new run: the held shipper recorded its
    // turn 2, which Redis lost, and the next turn finds it in the ledger.
    let (_, state) = granted(&store, &begin_req(&bait, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref()),
        (2, Some(&b"b2"[..]))
    );
}
