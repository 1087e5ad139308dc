//! The ledger sweep and the replica list read indexes, never the keyspace:
//! their cost does not grow with the keys Redis holds. One sweeper runs at
//! a time; a stopped shipper leaves its records to the others; wake-ups
//! dropped while Postgres is down are shipped by the sweep once it is back.

use baton_session_contract::cases;
mod ledgered;

use std::collections::HashMap;
use std::time::Duration;

use baton_ledger::{RedisLedgerStore, SWEEP_AFTER};
use baton_session::*;
use baton_store_redis::UNSHIPPED_INDEX;
use baton_testkit::wait_until_async;
use cases::{key, replica, turn};
use ledgered::Private;

async fn calls(admin: &mut ::redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    baton_testkit::redis_command_calls(admin).await
}

fn total(calls: &HashMap<String, u64>) -> u64 {
    calls.values().sum()
}

/// 200,000 keys that are not Baton's, in pipelines of MSETs.
async fn fill(admin: &mut ::redis::aio::MultiplexedConnection, keys: usize) {
    for chunk in (0..keys).collect::<Vec<_>>().chunks(10_000) {
        let mut pipe = ::redis::pipe();
        for part in chunk.chunks(500) {
            let pairs: Vec<(String, u8)> = part.iter().map(|i| (format!("other:{i}"), 1)).collect();
            pipe.mset(&pairs).ignore();
        }
        let () = pipe.query_async(admin).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_and_the_replica_list_walk_no_keyspace() {
    let servers = Private::start("sweep");
    let mut admin = servers.admin().await;
    fill(&mut admin, 200_000).await;
    // Commits from a replica whose shipper never ran (killed at once).
    let writer = RedisLedgerStore::connect_without_shipper(&servers.redis.url(), &servers.database)
        .await
        .unwrap();
    let a = replica(&writer, "a").await;
    for s in ["one", "two", "three"] {
        turn(&writer, &key(s), &a, "t1").await;
    }
    let sweeper =
        RedisLedgerStore::connect_without_shipper(&servers.redis.url(), &servers.database)
            .await
            .unwrap();
    // The first sweep indexes what predates the index: the one SCAN.
    sweeper.sweep_now().await.unwrap();
    let before = calls(&mut admin).await;
    wait_until_async(
        SWEEP_AFTER * 5,
        "the sweep to ship the killed replica's records",
        || async {
            sweeper.sweep_now().await.unwrap();
            let mut shipped = 0;
            for s in ["one", "two", "three"] {
                shipped += sweeper.ledger().turn_count(&key(s)).await.unwrap();
            }
            shipped == 3
        },
    )
    .await;
    // Shipped logs are empty: their entries leave the index.
    wait_until_async(SWEEP_AFTER * 5, "the index to empty", || async {
        sweeper.sweep_now().await.unwrap();
        let left: u64 = ::redis::cmd("ZCARD")
            .arg(UNSHIPPED_INDEX)
            .query_async(&mut admin.clone())
            .await
            .unwrap();
        left == 0
    })
    .await;
    // An idle sweep: a handful of commands, whatever Redis holds.
    let idle_before = total(&calls(&mut admin).await);
    sweeper.sweep_now().await.unwrap();
    // Less the INFO itself; commands inside scripts count as well.
    let idle = total(&calls(&mut admin).await) - idle_before - 1;
    let after = calls(&mut admin).await;
    assert_eq!(
        after.get("scan"),
        before.get("scan"),
        "no SCAN after the backfill"
    );
    assert!(idle <= 4, "an idle sweep sent {idle} commands");
    // The replica list: the index and the heartbeat keys, no SCAN either.
    let listed = sweeper.replicas().await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    assert_eq!(calls(&mut admin).await.get("scan"), before.get("scan"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sweeper_at_a_time() {
    let servers = Private::start("sweepers");
    let mut admin = servers.admin().await;
    let a = RedisLedgerStore::connect_without_shipper(&servers.redis.url(), &servers.database)
        .await
        .unwrap();
    let b = RedisLedgerStore::connect_without_shipper(&servers.redis.url(), &servers.database)
        .await
        .unwrap();
    assert_ne!(a.shipper_id(), b.shipper_id());
    let holder = async |admin: &mut ::redis::aio::MultiplexedConnection| -> Option<String> {
        ::redis::cmd("GET")
            .arg("baton:sweeper")
            .query_async(admin)
            .await
            .unwrap()
    };
    a.sweep().await.unwrap();
    assert_eq!(holder(&mut admin).await.as_deref(), Some(a.shipper_id()));
    b.sweep().await.unwrap();
    assert_eq!(holder(&mut admin).await.as_deref(), Some(a.shipper_id()));
    // Its script is loaded now: count what a sweep without the lease sends.
    let scans = calls(&mut admin).await;
    b.sweep().await.unwrap();
    assert_eq!(holder(&mut admin).await.as_deref(), Some(a.shipper_id()));
    let now = calls(&mut admin).await;
    let sent: HashMap<&String, u64> = now
        .iter()
        .map(|(c, n)| (c, n - scans.get(c).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    // Its one call of the lease script (whose GET counts too) and the
    // test's own INFO and GET: nothing else.
    let expected: HashMap<String, u64> = [("evalsha", 1), ("get", 2), ("info", 1)]
        .into_iter()
        .map(|(c, n)| (c.to_owned(), n))
        .collect();
    let sent: HashMap<String, u64> = sent.into_iter().map(|(c, n)| (c.clone(), n)).collect();
    assert_eq!(
        sent, expected,
        "a shipper without the lease stops at asking for it"
    );
    // The holder dies: its lease lapses (here: goes) and another sweeps.
    let () = ::redis::cmd("DEL")
        .arg("baton:sweeper")
        .query_async(&mut admin)
        .await
        .unwrap();
    b.sweep().await.unwrap();
    assert_eq!(holder(&mut admin).await.as_deref(), Some(b.shipper_id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_shipper_leaves_its_records_to_the_sweep() {
    let servers = Private::start("stopped");
    let leaving = ledgered::replica_store(&servers).await;
    let a = replica(&leaving, "a").await;
    turn(&leaving, &key("before"), &a, "t1").await;
    wait_until_async(Duration::from_secs(10), "the woken shipper", || async {
        leaving.ledger().turn_count(&key("before")).await.unwrap() == 1
    })
    .await;
    // Returns once the shipper's task ended.
    tokio::time::timeout(Duration::from_secs(10), leaving.stop_shipping())
        .await
        .expect("the shipper stops");
    turn(&leaving, &key("after"), &a, "t1").await;
    let other = RedisLedgerStore::connect_without_shipper(&servers.redis.url(), &servers.database)
        .await
        .unwrap();
    wait_until_async(SWEEP_AFTER * 5, "another replica's sweep", || async {
        other.sweep_now().await.unwrap();
        other.ledger().turn_count(&key("after")).await.unwrap() == 1
    })
    .await;
}

/// While Postgres is down, every commit still succeeds and its wake-up
/// either queues (at most a bounded number) or is dropped; once Postgres is
/// back, the sweep ships every record, dropped wake-ups included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_drops_wake_ups_and_the_sweep_ships_them_later() {
    let mut servers = Private::start("outage");
    let store = ledgered::replica_store(&servers).await;
    let a = replica(&store, "a").await;
    // More sessions than the wake-up queue holds; each starts while the
    // ledger answers (a new session asks it whether it is new).
    let sessions = 5000;
    for i in 0..sessions {
        turn(&store, &key(&format!("s{i}")), &a, "t1").await;
    }
    servers.postgres.stop();
    for i in 0..sessions {
        turn(&store, &key(&format!("s{i}")), &a, "t2").await;
    }
    servers.postgres.start_again();
    wait_until_async(Duration::from_secs(60), "every record shipped", || async {
        let Ok(pool) = sqlx::PgPool::connect(&servers.database).await else {
            return false;
        };
        let shipped: Result<i64, _> = sqlx::query_scalar("SELECT count(*) FROM turns")
            .fetch_one(&pool)
            .await;
        pool.close().await;
        shipped.is_ok_and(|n| n == 2 * sessions)
    })
    .await;
}

/// A replica says since when its commits wait for the ledger (the
/// dashboard's "oldest unshipped"): nothing once they shipped, the time of
/// the first commit the ledger missed while Postgres is down, unchanged by
/// later commits, and nothing again once they shipped after it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_says_since_when_its_commits_wait_for_the_ledger() {
    let mut servers = Private::start("oldest");
    let store = ledgered::replica_store(&servers).await;
    let a = replica(&store, "a").await;
    turn(&store, &key("one"), &a, "t1").await;
    let wait = Duration::from_secs(30);
    wait_until_async(wait, "the first turn shipped", || async {
        store.oldest_unshipped_ms().is_none()
    })
    .await;

    servers.postgres.stop();
    let before = turn_record::now_ms();
    turn(&store, &key("one"), &a, "t2").await;
    let oldest = store.oldest_unshipped_ms().expect("a commit waits");
    assert!((before..=turn_record::now_ms()).contains(&oldest));
    turn(&store, &key("two"), &a, "t1").await;
    assert_eq!(store.oldest_unshipped_ms(), Some(oldest));
    let info = ReplicaInfo {
        replica: "a".into(),
        oldest_unshipped_ms: store.oldest_unshipped_ms(),
        ..ReplicaInfo::default()
    };
    store
        .heartbeat_with(&a, info, Duration::from_secs(60))
        .await
        .unwrap();
    let replicas = store.replicas().await.unwrap();
    let view = replicas.iter().find(|r| r.id == "a").unwrap();
    assert_eq!(view.info.oldest_unshipped_ms, Some(oldest));

    servers.postgres.start_again();
    wait_until_async(wait, "the waiting commits shipped", || async {
        store.oldest_unshipped_ms().is_none()
    })
    .await;
}
