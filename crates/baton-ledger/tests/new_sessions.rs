//! New conversations without Postgres (`redis/known.rs`): a session Redis
//! never saw committed, in a Redis run whose "known" markers are complete,
//! starts without asking the ledger, so a Postgres outage stops neither
//! existing conversations nor new ones, and everything ships once it is
//! back. A session whose state is gone still waits for the ledger, and so
//! does every new one whenever the markers cannot be trusted: after a
//! Redis restart until the sweeper has marked everything again, with an
//! eviction policy that could drop a marker, with markers of an older
//! layout missing.

use baton_session_contract::cases;
mod ledgered;

use std::time::Duration;

use ::redis::AsyncCommands;
use baton_ledger::RedisLedgerStore;
use baton_session::*;
use baton_store_redis::SessionKeys;
use baton_testkit::{RedisServer, poll_async, wait_until_async};
use cases::{begin_req, commit_req, granted, key, replica, turn};
use ledgered::Private;

const WAIT: Duration = Duration::from_secs(60);
const WATERMARK: &str = "baton:known:complete";

async fn run_id(admin: &mut ::redis::aio::MultiplexedConnection) -> String {
    let info: String = ::redis::cmd("INFO")
        .arg("server")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .unwrap()
        .trim()
        .to_owned()
}

/// Waits until the sweeper has declared the markers complete for the run
/// Redis is now.
async fn wait_for_a_complete_index(redis: &RedisServer) {
    wait_until_async(WAIT, "the known index to be complete", || async {
        let Ok(client) = ::redis::Client::open(redis.url()) else {
            return false;
        };
        let Ok(mut admin) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        let run = run_id(&mut admin).await;
        let watermark: Option<String> = admin.get(WATERMARK).await.unwrap();
        watermark == Some(run)
    })
    .await;
}

async fn shipped_turns(database: &str) -> Option<i64> {
    let pool = sqlx::PgPool::connect(database).await.ok()?;
    let n = sqlx::query_scalar("SELECT count(*) FROM turns")
        .fetch_one(&pool)
        .await
        .ok();
    pool.close().await;
    n
}

fn is_unavailable<T: std::fmt::Debug>(result: &StoreResult<T>) -> bool {
    matches!(result, Err(StoreError::Unavailable(_)))
}

/// A turn under a short state TTL, so its state expires during the test.
async fn brief_turn(store: &RedisLedgerStore, key: &SessionKey, replica: &ReplicaId) {
    let ttl = Duration::from_millis(1500);
    let mut req = begin_req(key, replica, None);
    req.lease_ttl = ttl;
    req.state_ttl = ttl;
    let (lease, _) = granted(store, &req).await;
    let mut commit = commit_req(&lease, "brief", "ok");
    commit.state_ttl = ttl;
    assert!(matches!(
        store.commit(&commit).await.unwrap(),
        CommitOutcome::Committed { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_postgres_outage_new_and_existing_sessions_go_on_and_ship_after() {
    let mut servers = Private::start("outage");
    let store = ledgered::replica_store(&servers).await;
    let mut admin = servers.admin().await;
    let a = replica(&store, "a").await;
    turn(&store, &key("old"), &a, "t1").await;
    brief_turn(&store, &key("brief"), &a).await;
    wait_for_a_complete_index(&servers.redis).await;
    let brief_state = SessionKeys::new(&key("brief")).state;
    wait_until_async(WAIT, "the brief session's state to expire", || {
        let mut admin = admin.clone();
        let brief_state = brief_state.clone();
        async move { !admin.exists::<_, bool>(&brief_state).await.unwrap() }
    })
    .await;

    servers.postgres.stop();
    let fresh = 20;
    for i in 0..fresh {
        let version = turn(&store, &key(&format!("new-{i}")), &a, "t1").await;
        assert_eq!(version, 1, "a new session starts at version 1");
    }
    assert_eq!(turn(&store, &key("old"), &a, "t2").await, 2);
    // Its state is gone: only the ledger can say what it was. Refused, not
    // restarted at version 1 as if new.
    let refused = store.begin(&begin_req(&key("brief"), &a, None)).await;
    assert!(
        is_unavailable(&refused),
        "a session whose state expired must wait for the ledger, got {refused:?}"
    );
    assert!(!admin.exists::<_, bool>(&brief_state).await.unwrap());

    servers.postgres.start_again();
    // With the ledger back, restored from its durable copy (this turn asks
    // for a day's state TTL), not restarted as new.
    let (lease, state) = granted(&store, &begin_req(&key("brief"), &a, None)).await;
    assert_eq!(state.version, 1);
    assert_eq!(state.payload.as_deref(), Some(&b"brief"[..]));
    store
        .commit(&commit_req(&lease, "again", "ok"))
        .await
        .unwrap();
    let expected = 2 + fresh + 2;
    wait_until_async(WAIT, "every turn shipped to the ledger", || async {
        shipped_turns(&servers.database).await == Some(expected)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_redis_restart_new_sessions_ask_the_ledger_until_the_index_is_rebuilt() {
    let mut servers = Private::start_with("restart", true);
    let store = ledgered::replica_store(&servers).await;
    let a = replica(&store, "a").await;
    turn(&store, &key("old"), &a, "t1").await;
    wait_for_a_complete_index(&servers.redis).await;

    servers.postgres.stop();
    // A new run: it may have loaded an older dataset than it acknowledged,
    // so the watermark of the run before vouches for nothing.
    servers.redis.start_again();
    poll_async(WAIT, "the store to reach the new Redis", || async {
        store.heartbeat(&a, cases::LONG).await.ok()
    })
    .await;
    let refused = store.begin(&begin_req(&key("fresh"), &a, None)).await;
    assert!(
        is_unavailable(&refused),
        "without a complete index for this run a new session asks the ledger, got {refused:?}"
    );
    let mut admin = servers.admin().await;
    let fresh_state = SessionKeys::new(&key("fresh")).state;
    assert!(!admin.exists::<_, bool>(&fresh_state).await.unwrap());

    servers.postgres.start_again();
    assert_eq!(turn(&store, &key("fresh"), &a, "t1").await, 1);
    wait_for_a_complete_index(&servers.redis).await;
    servers.postgres.stop();
    assert_eq!(turn(&store, &key("fresh-2"), &a, "t1").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_markers_never_trusts_their_absence() {
    let mut servers = Private::start("evict");
    let store = ledgered::replica_store(&servers).await;
    let a = replica(&store, "a").await;
    turn(&store, &key("old"), &a, "t1").await;
    wait_for_a_complete_index(&servers.redis).await;

    let mut admin = servers.admin().await;
    let () = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut admin)
        .await
        .unwrap();
    wait_until_async(WAIT, "the sweeper to drop the watermark", || {
        let mut admin = admin.clone();
        async move { !admin.exists::<_, bool>(WATERMARK).await.unwrap() }
    })
    .await;
    servers.postgres.stop();
    let refused = store.begin(&begin_req(&key("fresh"), &a, None)).await;
    assert!(is_unavailable(&refused), "got {refused:?}");
}

/// Sessions committed before markers existed (simulated by deleting them):
/// the sweeper marks every session the ledger knows, over several pages,
/// and every one whose records wait unshipped, before it trusts absence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_without_markers_are_marked_before_absence_is_trusted() {
    let mut servers = Private::start("backfill");
    let writer = RedisLedgerStore::connect_without_shipper(&servers.redis.url(), &servers.database)
        .await
        .unwrap();
    let a = replica(&writer, "a").await;
    // More than one page of the ledger's session list.
    let shipped: Vec<SessionKey> = (0..1200).map(|i| key(&format!("s{i:04}"))).collect();
    for k in &shipped {
        turn(&writer, k, &a, "t1").await;
    }
    writer.ship_many(&shipped).await.unwrap();
    turn(&writer, &key("unshipped"), &a, "t1").await;
    let mut admin = servers.admin().await;
    let markers: Vec<String> = admin.keys("baton:{*}:known").await.unwrap();
    assert_eq!(markers.len(), shipped.len() + 1, "every commit marks");
    let _: i64 = admin.del(&markers).await.unwrap();

    let sweeper = ledgered::replica_store(&servers).await;
    wait_for_a_complete_index(&servers.redis).await;
    let markers: Vec<String> = admin.keys("baton:{*}:known").await.unwrap();
    assert_eq!(markers.len(), shipped.len() + 1);

    // A marked session whose state is gone is not new.
    let gone = &shipped[777];
    let keys = SessionKeys::new(gone);
    let _: i64 = admin.del(&[&keys.state, &keys.payload]).await.unwrap();
    servers.postgres.stop();
    let refused = sweeper.begin(&begin_req(gone, &a, None)).await;
    assert!(is_unavailable(&refused), "got {refused:?}");
    servers.postgres.start_again();
    // The ledger restores it from its durable copy (or says it was lost):
    // never a new session at version 0.
    match sweeper.begin(&begin_req(gone, &a, None)).await.unwrap() {
        BeginOutcome::Granted { state, .. } => {
            assert_eq!(state.version, 1);
            assert_eq!(state.payload.as_deref(), Some(&b"t1"[..]));
        }
        BeginOutcome::StateLost { last_version } => assert_eq!(last_version, 1),
        other => panic!("got {other:?}"),
    }
}
