//! Stored data the protocol never writes is reported as a typed error, and
//! nothing is written over it.

#[allow(dead_code)]
#[path = "contract/cases.rs"]
mod cases;

use baton_session::redis::RedisStore;
use baton_session::sqlite::SqliteStore;
use baton_session::*;
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

    let mut admin = ::redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = baton_session::redis::SessionKeys::new(&k);
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
    let mut admin = ::redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = baton_session::redis::SessionKeys::new(&k);
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
