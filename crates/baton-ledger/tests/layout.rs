//! The data layout record in Redis: the first replica records its layout;
//! a replica of another layout reads the record and serves nothing; with
//! `adopt` it takes the stores over only once no live replica says another
//! layout (a replica that says none counts as another).

use std::time::Duration;

use baton_session::*;
use baton_store_redis::RedisStore;
use baton_testkit::RedisServer;

fn says(layout: Option<u32>) -> ReplicaInfo {
    ReplicaInfo {
        replica: "r".into(),
        layout,
        ..ReplicaInfo::default()
    }
}

#[tokio::test]
async fn the_first_layout_is_kept_and_another_takes_over_only_when_alone_and_allowed() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    assert_eq!(
        store.claim_layout(2, false).await.unwrap(),
        2,
        "first: recorded"
    );
    assert_eq!(store.claim_layout(2, false).await.unwrap(), 2);
    assert_eq!(
        store.claim_layout(3, false).await.unwrap(),
        2,
        "another build reads the record"
    );

    // A live replica of layout 2, and one that says nothing, hold it.
    let old = ReplicaId::new("old-1").unwrap();
    let silent = ReplicaId::new("silent-1").unwrap();
    let ttl = Duration::from_millis(1500);
    store
        .heartbeat_with(&old, says(Some(2)), ttl)
        .await
        .unwrap();
    store
        .heartbeat_with(&silent, says(None), ttl)
        .await
        .unwrap();
    assert_eq!(store.claim_layout(3, true).await.unwrap(), 2);
    let new = ReplicaId::new("new-1").unwrap();
    store
        .heartbeat_with(&new, says(Some(3)), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(store.claim_layout(3, true).await.unwrap(), 2);
    // Once their heartbeats lapse, the new layout takes the stores.
    baton_testkit::wait_until_async(
        Duration::from_secs(10),
        "the old heartbeats to lapse",
        || async { store.claim_layout(3, true).await.unwrap() == 3 },
    )
    .await;
    assert_eq!(
        store.claim_layout(2, false).await.unwrap(),
        3,
        "now the old build is the stranger"
    );
    // The embedded store is one build's alone: no record.
    let dir = tempfile::tempdir().unwrap();
    let sqlite = baton_store_sqlite::SqliteStore::open(&dir.path().join("b.db"))
        .await
        .unwrap();
    assert_eq!(sqlite.claim_layout(7, false).await.unwrap(), 7);
}
