//! Stored data the protocol never writes is reported as a typed error, and
//! nothing is written over it.

use baton_session_contract::cases;

use baton_session::*;
use baton_store_redis::RedisStore;
use baton_store_sqlite::SqliteStore;
use baton_testkit::RedisServer;
use cases::{begin_req, commit_req, granted, key, replica, turn};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_corrupt_counters_without_overwriting_them() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let a = replica(&store, "a").await;
    let k = key("corrupt");
    turn(&store, &k, &a, "t1").await;
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;

    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let keys = baton_store_redis::SessionKeys::new(&k);
    let state = keys.state.clone();
    let () = ::redis::cmd("HSET")
        .arg(&state)
        .arg("version")
        .arg("garbage")
        .query_async(&mut admin)
        .await
        .unwrap();

    assert!(matches!(
        store.commit(&commit_req(&lease, "t2", "r")).await,
        Err(StoreError::Corrupt(_))
    ));
    store.abort(&lease).await.unwrap();
    assert!(matches!(
        store.begin(&begin_req(&k, &a, None)).await,
        Err(StoreError::Corrupt(_))
    ));
    let () = ::redis::cmd("HSET")
        .arg(&state)
        .arg("version")
        .arg("1")
        .arg("seq")
        .arg("x1")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(matches!(
        store.begin(&begin_req(&k, &a, None)).await,
        Err(StoreError::Corrupt(_))
    ));
    let left: String = ::redis::cmd("GET")
        .arg(&keys.payload)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(left, "t1", "the stored state was not overwritten");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_a_version_whose_payload_is_gone() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let a = replica(&store, "a").await;
    let k = key("evicted");
    turn(&store, &k, &a, "t1").await;
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let keys = baton_store_redis::SessionKeys::new(&k);
    let () = ::redis::cmd("DEL")
        .arg(&keys.payload)
        .query_async(&mut admin)
        .await
        .unwrap();
    // Read as empty, the next commit would overwrite the real state with it.
    assert!(matches!(
        store.begin(&begin_req(&k, &a, None)).await,
        Err(StoreError::Corrupt(_))
    ));
}

/// The normal flow never leaves a state without its payload: a commit's
/// payload outlives its state by at most a minute (the staged key's TTL),
/// and a grant or renewal that extends them gives both the same instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_payload_never_expires_before_its_state() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let a = replica(&store, "a").await;
    let k = key("together");
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let keys = baton_store_redis::SessionKeys::new(&k);
    let mut log_conn = admin.clone();
    let mut expiries = async || -> (i64, i64) {
        let mut times = Vec::new();
        for key in [&keys.state, &keys.payload] {
            let at: i64 = ::redis::cmd("PEXPIRETIME")
                .arg(key)
                .query_async(&mut admin)
                .await
                .unwrap();
            times.push(at);
        }
        (times[0], times[1])
    };
    // A state TTL shorter than the lease (60 s), and long enough to be still
    // there when the expiries are read.
    let short = std::time::Duration::from_secs(5);
    let begin = BeginRequest {
        state_ttl: short,
        ..begin_req(&k, &a, None)
    };
    let (lease, _) = granted(&store, &begin).await;
    let commit = CommitRequest {
        state_ttl: short,
        ..commit_req(&lease, "t1", "r")
    };
    store.commit(&commit).await.unwrap();
    let (committed, payload) = expiries().await;
    assert!(committed > 0, "the state has a TTL");
    // The staged payload carries the state TTL plus a minute; RENAME keeps
    // it, so the commit needs no PEXPIRE of its own.
    assert!(
        (committed..=committed + 61_000).contains(&payload),
        "after a commit the payload outlives its state, by at most a minute: {payload} vs {committed}"
    );
    // Every commit gives its session log (unshipped turn records) a week,
    // whatever the state TTL: records must outlive a long Postgres outage.
    let log_ttl: i64 = ::redis::cmd("PTTL")
        .arg(&keys.log)
        .query_async(&mut log_conn)
        .await
        .unwrap();
    assert!(
        log_ttl > 6 * 24 * 3600 * 1000,
        "the log lives a week after a commit, not {log_ttl} ms"
    );

    // The next grant's lease outlasts the state: it extends both.
    let (lease, _) = granted(&store, &begin).await;
    let (state, payload) = expiries().await;
    assert!(state > committed, "the grant extended the state");
    assert_eq!(state, payload, "after a grant that refreshed them");
    assert!(store.renew(&lease, cases::DAY).await.unwrap());
    let (renewed, payload) = expiries().await;
    assert!(renewed > state, "a renewal past the state's end extends it");
    assert_eq!(renewed, payload, "after a renewal that extended them");

    // A state TTL longer than the staging margin: the payload still
    // outlives the state.
    let commit = CommitRequest {
        state_ttl: cases::DAY,
        ..commit_req(&lease, "t2", "r")
    };
    store.commit(&commit).await.unwrap();
    let (state, payload) = expiries().await;
    assert!(
        (state..=state + 61_000).contains(&payload),
        "a day's state TTL: payload {payload} vs state {state}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_corrupt_counters_without_overwriting_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let a = replica(&store, "a").await;
    let k = key("corrupt");
    turn(&store, &k, &a, "t1").await;

    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    sqlx::query("UPDATE session_state SET version = 'garbage'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        matches!(
            store.begin(&begin_req(&k, &a, None)).await,
            Err(StoreError::Corrupt(_))
        ),
        "a text version is refused"
    );
    let payload: Vec<u8> = sqlx::query_scalar("SELECT payload FROM session_state")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(payload, b"t1", "the stored state was not overwritten");
}

/// The session view (what the dashboard and `GET /v1/sessions/..` show)
/// reads the same counters: one that is not a number is an error, not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_session_view_refuses_corrupt_counters() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let a = replica(&store, "a").await;
    let k = key("view");
    turn(&store, &k, &a, "t1").await;
    assert_eq!(store.session(&k).await.unwrap().unwrap().version, 1);
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    for (field, value) in [("seq", "x"), ("version", "-1"), ("updated", "1e9")] {
        let state = baton_store_redis::SessionKeys::new(&k).state;
        let before: Option<String> = ::redis::cmd("HGET")
            .arg(&state)
            .arg(field)
            .query_async(&mut admin)
            .await
            .unwrap();
        let () = ::redis::cmd("HSET")
            .arg(&state)
            .arg(field)
            .arg(value)
            .query_async(&mut admin)
            .await
            .unwrap();
        match store.session(&k).await {
            Err(StoreError::Corrupt(why)) => assert!(why.contains(field), "{why}"),
            other => panic!("{field}={value}: {other:?}"),
        }
        let () = ::redis::cmd("HSET")
            .arg(&state)
            .arg(field)
            .arg(before.unwrap())
            .query_async(&mut admin)
            .await
            .unwrap();
    }
}

/// A state whose payload is gone must not reach the ledger as an empty
/// durable copy (G7 would later restore "nothing" as the session's state):
/// shipping that session fails with a typed error, the ledger keeps what
/// it had, and the records stay in Redis for when it is mended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_payload_is_never_shipped_as_an_empty_copy() {
    let redis = RedisServer::start();
    let postgres = baton_testkit::PostgresServer::start();
    let database = postgres.create_database("corrupt");
    let store = baton_ledger::RedisLedgerStore::connect_without_shipper(&redis.url(), &database)
        .await
        .unwrap();
    let a = replica(&store, "a").await;
    let k = key("no-payload");
    turn(&store, &k, &a, "t1").await;
    assert_eq!(store.ship(&k).await.unwrap(), 1);
    turn(&store, &k, &a, "t2").await;
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let keys = baton_store_redis::SessionKeys::new(&k);
    let () = ::redis::cmd("DEL")
        .arg(&keys.payload)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(matches!(store.ship(&k).await, Err(StoreError::Corrupt(_))));
    let known = store.ledger().session(&k).await.unwrap().unwrap();
    let durable = known.durable.expect("the first turn's copy");
    assert_eq!((durable.version, &durable.payload[..]), (1, &b"t1"[..]));
    let unshipped: i64 = ::redis::cmd("LLEN")
        .arg(&keys.log)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(unshipped, 1, "the record waits in Redis");
}
