//! The runtime on a real Redis Cluster (three masters, a replica each)
//! under faults: an uncontended turn is still two round trips; a master
//! SIGKILLed under load fails over to its replica; a slot moves between
//! masters under load. Turns run through the ledgered store as a replica
//! runs them, several sessions on every master.

use baton_session_contract::cases;
mod ledgered;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_ledger::RedisLedgerStore;
use baton_session::*;
use baton_store_redis::slots::{bucket_of, slot_of_bucket};
use baton_testkit::{RedisCluster, wait_until_async};
use bytes::Bytes;
use cases::{begin_req, key, replica, turn};

/// The cluster slot a session's keys live in (its bucket's).
fn slot_of_session(k: &SessionKey) -> u16 {
    slot_of_bucket(bucket_of(&format!("{}:{}", k.tenant, k.session)))
}

/// `per_master` sessions on every master of `cluster`.
fn sessions_on_every_master(cluster: &RedisCluster, per_master: usize) -> Vec<SessionKey> {
    let shards = cluster.shards();
    let mut by_master: BTreeMap<u16, Vec<SessionKey>> = BTreeMap::new();
    for n in 0.. {
        let k = key(&format!("load-{n}"));
        let master = shards
            .iter()
            .find(|s| s.serves(slot_of_session(&k)))
            .unwrap()
            .master_port;
        let on_it = by_master.entry(master).or_default();
        if on_it.len() < per_master {
            on_it.push(k);
        }
        if by_master.len() == shards.len() && by_master.values().all(|v| v.len() == per_master) {
            break;
        }
    }
    by_master.into_values().flatten().collect()
}

/// What one session's load saw.
#[derive(Debug, Default)]
struct SessionLog {
    /// (version, when) of every acknowledged commit.
    acked: Vec<(u64, Instant)>,
    /// Errors (the store unavailable), with when.
    errors: Vec<(String, Instant)>,
    /// Versions granted after an acknowledged one, lower than it: a
    /// session silently gone back.
    went_back: Vec<(u64, u64)>,
    state_lost: usize,
    /// Turns wasted: granted, then refused at commit.
    lease_lost: usize,
}

/// Runs turns on `k` until `stop`: each commits the count of turns so far.
async fn load(store: RedisLedgerStore, k: SessionKey, stop: Arc<AtomicBool>) -> SessionLog {
    let me = ReplicaId::new(format!("loader-{}", k.session)).unwrap();
    let mut log = SessionLog::default();
    let mut highest = 0;
    let _ = store.heartbeat(&me, cases::LONG).await;
    while !stop.load(Ordering::Relaxed) {
        let mut req = begin_req(&k, &me, None);
        req.reclaim_own_lease = true;
        let (lease, state) = match store.begin(&req).await {
            Ok(BeginOutcome::Granted { lease, state }) => (lease, state),
            Ok(BeginOutcome::StateLost { .. }) => {
                log.state_lost += 1;
                break;
            }
            Ok(other) => panic!("{k}: unexpected {other:?}"),
            Err(e) => {
                log.errors.push((e.to_string(), Instant::now()));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        if state.version < highest {
            log.went_back.push((highest, state.version));
        }
        let commit = CommitRequest {
            lease: lease.clone(),
            expected_version: state.version,
            payload: Bytes::from((state.version + 1).to_string()),
            workspace: None,
            reply: Bytes::from_static(b"ok"),
            state_ttl: cases::DAY,
            started_at_ms: 1,
            input_digest: format!("{}-{}", k.session, state.version + 1),
            input: None,
        };
        match store.commit(&commit).await {
            Ok(CommitOutcome::Committed { version }) => {
                highest = version;
                log.acked.push((version, Instant::now()));
            }
            Ok(CommitOutcome::LeaseLost) => log.lease_lost += 1,
            Ok(other) => panic!("{k}: unexpected {other:?}"),
            // Perhaps committed, perhaps not: the next begin tells.
            Err(e) => log.errors.push((e.to_string(), Instant::now())),
        }
    }
    log
}

struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<(SessionKey, tokio::task::JoinHandle<SessionLog>)>,
}

impl Load {
    fn start(store: &RedisLedgerStore, sessions: &[SessionKey]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = sessions
            .iter()
            .map(|k| {
                (
                    k.clone(),
                    tokio::spawn(load(store.clone(), k.clone(), stop.clone())),
                )
            })
            .collect();
        Self { stop, tasks }
    }

    async fn stop(self) -> Vec<(SessionKey, SessionLog)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut logs = Vec::new();
        for (k, task) in self.tasks {
            logs.push((k, task.await.unwrap()));
        }
        logs
    }
}

/// Waits until every session of `store` acknowledged `more` turns beyond
/// what it has now.
async fn wait_for_turns(store: &RedisLedgerStore, sessions: &[SessionKey], more: u64) {
    let mut goals = Vec::new();
    for k in sessions {
        let now = store
            .session(k)
            .await
            .ok()
            .flatten()
            .map_or(0, |s| s.version);
        goals.push((k.clone(), now + more));
    }
    wait_until_async(Duration::from_secs(60), "every session to go on", || {
        let goals = &goals;
        async move {
            for (k, goal) in goals {
                let at = store
                    .session(k)
                    .await
                    .ok()
                    .flatten()
                    .map_or(0, |s| s.version);
                if at < *goal {
                    return false;
                }
            }
            true
        }
    })
    .await;
}

/// The ledger holds each session's turns 1..=N once each, N is the state's
/// version in Redis, and every acknowledged version is among them except
/// those acknowledged within `loss_window` before `fault` (Redis Cluster
/// replicates asynchronously: a master killed right after answering may
/// not have passed the write on).
async fn check_ledger(
    store: &RedisLedgerStore,
    database: &str,
    logs: &[(SessionKey, SessionLog)],
    fault: Instant,
    loss_window: Duration,
) {
    let keys: Vec<SessionKey> = logs.iter().map(|(k, _)| k.clone()).collect();
    wait_until_async(Duration::from_secs(30), "the ledger to catch up", || {
        let keys = &keys;
        async move {
            let _ = store.ship_many(keys).await;
            for k in keys {
                let (Ok(Some(state)), Ok(rows)) =
                    (store.session(k).await, store.ledger().turn_count(k).await)
                else {
                    return false;
                };
                if rows != state.version {
                    return false;
                }
            }
            true
        }
    })
    .await;
    let pg = sqlx::PgPool::connect(database).await.unwrap();
    for (k, log) in logs {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT turn_seq, version FROM turns WHERE tenant = $1 AND session = $2 ORDER BY turn_seq",
        )
        .bind(k.tenant.as_str())
        .bind(k.session.as_str())
        .fetch_all(&pg)
        .await
        .unwrap();
        let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
        assert!(
            seqs == expected,
            "{k}: the ledger's turns are not 1..N once each: {seqs:?}"
        );
        let in_ledger: std::collections::BTreeSet<u64> = rows.iter().map(|r| r.1 as u64).collect();
        for (version, at) in &log.acked {
            let lost_in_window = *at <= fault && fault.duration_since(*at) < loss_window;
            assert!(
                in_ledger.contains(version) || lost_in_window,
                "{k}: acknowledged version {version} is not in the ledger"
            );
        }
        assert_eq!(log.lease_lost, 0, "{k}: a turn was granted, then refused");
        assert!(
            log.went_back.is_empty(),
            "{k}: granted an older version than one acknowledged: {:?}",
            log.went_back
        );
    }
}

/// An uncontended turn on a cluster is still two round trips to one
/// master: the begin script with a GET of the payload, then the index
/// entry, the staged payload and the commit script. MONITOR on every
/// master shows nothing else, anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_turn_is_two_round_trips_on_one_master() {
    use std::io::{BufRead, BufReader, Write};
    let cluster = ledgered::cluster();
    let store = RedisLedgerStore::connect_without_shipper_in(
        &cluster.url(),
        &ledgered::database(),
        &ledgered::namespace(),
    )
    .await
    .unwrap();
    let a = replica(&store, "a").await;
    let k = key("two-trips");
    turn(&store, &k, &a, "t1").await;

    let masters: Vec<u16> = cluster.shards().iter().map(|s| s.master_port).collect();
    let monitors: Vec<_> = masters
        .iter()
        .map(|&port| {
            let mut monitor = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            monitor.write_all(b"MONITOR\r\n").unwrap();
            let mut lines = BufReader::new(monitor.try_clone().unwrap()).lines();
            assert_eq!(lines.next().unwrap().unwrap(), "+OK");
            std::thread::spawn(move || {
                let mut top_level = Vec::new();
                for line in lines.map_while(Result::ok) {
                    if line.contains("\"ECHO\" \"end-of-turn\"") {
                        break;
                    }
                    // Commands a script runs, and the cluster's own.
                    if !line.contains("lua]") && !line.contains("\"CLUSTER\"") {
                        top_level.push(line);
                    }
                }
                (port, top_level)
            })
        })
        .collect();
    turn(&store, &k, &a, "t2").await;
    for &port in &masters {
        let mut admin = baton_testkit::redis_admin(&format!("redis://127.0.0.1:{port}/")).await;
        let _: String = ::redis::cmd("ECHO")
            .arg("end-of-turn")
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    let owner = cluster.master_of(slot_of_session(&k)).master_port;
    for monitor in monitors {
        let (port, top_level) = monitor.join().unwrap();
        let commands: Vec<&str> = top_level
            .iter()
            .map(|l| l.split('"').nth(1).unwrap_or_default())
            .collect();
        if port == owner {
            assert_eq!(
                commands,
                ["EVALSHA", "GET", "ZADD", "PSETEX", "EVALSHA"],
                "{top_level:#?}"
            );
        } else {
            assert!(commands.is_empty(), "master {port}: {top_level:#?}");
        }
    }
}

/// A master SIGKILLed under load: its replica takes over; sessions on the
/// other masters go on without one error; those on the killed one come
/// back at the ledger's version, never an older one; every acknowledged
/// turn is in the ledger once.
///
/// redis-rs's cluster client failed this 1 run in 20 (1.8.2; 1.8.1: 1 in 2
/// to 4) by hanging after the kill; Baton's own client (`redis/cluster.rs`)
/// replaced it, and the test runs by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_over_and_loses_no_acknowledged_turn() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut cluster = RedisCluster::start(3, 1);
    let database = ledgered::database();
    let store = RedisLedgerStore::connect(&cluster.url(), &database)
        .await
        .unwrap();
    let sessions = sessions_on_every_master(&cluster, 3);
    let load = Load::start(&store, &sessions);
    wait_for_turns(&store, &sessions, 20).await;

    let victim = cluster.master_of(slot_of_session(&sessions[0]));
    let on_victim: Vec<SessionKey> = sessions
        .iter()
        .filter(|k| victim.serves(slot_of_session(k)))
        .cloned()
        .collect();
    let fault = Instant::now();
    cluster.kill(victim.master_port);
    cluster.wait_failover(slot_of_session(&sessions[0]), victim.master_port);
    let recovered_at = Instant::now();
    wait_for_turns(&store, &sessions, 10).await;
    let logs = load.stop().await;

    for (k, log) in &logs {
        if on_victim.contains(k) {
            assert_eq!(log.state_lost, 0, "{k}: the replica had the state");
            continue;
        }
        assert!(
            log.errors.is_empty(),
            "{k}: a session on a master that kept running saw errors: {:?}",
            log.errors
        );
    }
    let failed_over = recovered_at.duration_since(fault);
    eprintln!("failover took {failed_over:?}");
    check_ledger(&store, &database, &logs, fault, Duration::from_millis(100)).await;
}

/// A slot moves between masters under load (the keys of its bucket
/// migrate with MIGRATE while clients follow ASK and MOVED): nothing is
/// lost or duplicated, and the sessions go on on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_resharded_under_load_loses_and_duplicates_nothing() {
    let cluster = RedisCluster::start(3, 1);
    let database = ledgered::database();
    let store = RedisLedgerStore::connect(&cluster.url(), &database)
        .await
        .unwrap();
    let sessions = sessions_on_every_master(&cluster, 3);
    let load = Load::start(&store, &sessions);
    wait_for_turns(&store, &sessions, 20).await;

    let moving = slot_of_session(&sessions[0]);
    let from = cluster.master_of(moving);
    let to = cluster
        .shards()
        .into_iter()
        .find(|s| s.master_port != from.master_port)
        .unwrap();
    let fault = Instant::now();
    cluster.move_slot(moving, to.master_port);
    assert_eq!(cluster.master_of(moving).master_port, to.master_port);
    wait_for_turns(&store, &sessions, 10).await;
    let logs = load.stop().await;
    for (k, log) in &logs {
        assert_eq!(log.state_lost, 0, "{k}");
    }
    // Nothing was killed: no acknowledged turn may be missing.
    check_ledger(&store, &database, &logs, fault, Duration::ZERO).await;
}

/// A replica's own heartbeat key lives on one master. While that master is
/// down (here for good: no replica to take over), the sessions the dead
/// replica held on the other masters still fail over to a live one, with
/// no error: every master keeps a copy of every replica's heartbeat, and a
/// failover reads the copy on the session's own master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_fail_over_while_the_master_of_the_holders_heartbeat_is_down() {
    use baton_store_redis::RedisStore;
    use baton_store_redis::slots::slot_of;
    let mut cluster = RedisCluster::start(3, 0);
    let store = RedisStore::connect(&cluster.url()).await.unwrap();
    let shards = cluster.shards();
    let dead = (0..)
        .map(|n| format!("dead-{n}"))
        .find(|id| shards[0].serves(slot_of(format!("hb:{id}").as_bytes())))
        .unwrap();
    let held = (0..)
        .map(|n| key(&format!("held-{n}")))
        .find(|k| shards[1].serves(slot_of_session(k)))
        .unwrap();
    let dead = ReplicaId::new(&dead).unwrap();
    store
        .heartbeat(&dead, Duration::from_secs(2))
        .await
        .unwrap();
    let (_lease, _) = cases::granted(&store, &begin_req(&held, &dead, None)).await;
    let alive = replica(&store, "alive").await;

    // The dead replica beats no more, and its heartbeat's master goes down.
    cluster.kill(shards[0].master_port);
    let busy = std::sync::atomic::AtomicUsize::new(0);
    let granted = baton_testkit::poll_async(
        Duration::from_secs(30),
        "the live replica to take the session over",
        || {
            let (store, held, alive, busy) = (&store, &held, &alive, &busy);
            async move {
                match store.begin(&begin_req(held, alive, None)).await {
                    Ok(BeginOutcome::Granted { lease, .. }) => Some(lease),
                    Ok(BeginOutcome::Busy { .. }) => {
                        busy.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                    other => panic!("the session's master is up: {other:?}"),
                }
            }
        },
    )
    .await;
    assert!(
        busy.load(Ordering::Relaxed) > 0,
        "the dead replica's lease held until its heartbeat lapsed"
    );
    assert_eq!(granted.replica, alive);
}
