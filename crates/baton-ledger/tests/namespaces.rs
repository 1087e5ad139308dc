//! Two deployments on one Redis, one Postgres database and one bucket, each
//! in its store namespace: the same tenant and session ids are two
//! sessions, with their own versions, ledgers, files, sweeps and replica
//! lists; the empty namespace is the layout from before namespaces.

use baton_session_contract::cases;

use std::time::Duration;

use baton_ledger::RedisCatalog;
use baton_ledger::RedisLedgerStore;
use baton_session::*;
use baton_testkit::{PostgresServer, RedisServer, wait_until_async};
use baton_workspace::{Manifest, WorkspaceStore};
use cases::{key, replica, turn};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deployments_share_the_servers_and_never_meet() {
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let database = postgres.create_database("shared");
    let blue = RedisLedgerStore::connect_in(&redis.url(), &database, "prod.blue")
        .await
        .unwrap();
    let green = RedisLedgerStore::connect_in(&redis.url(), &database, "prod.green")
        .await
        .unwrap();
    let legacy = RedisLedgerStore::connect(&redis.url(), &database)
        .await
        .unwrap();
    let (b, g, l) = (
        replica(&blue, "blue-0").await,
        replica(&green, "green-0").await,
        replica(&legacy, "legacy-0").await,
    );
    let k = key("s-1");
    for i in 0..3 {
        turn(&blue, &k, &b, &format!("blue {i}")).await;
    }
    turn(&green, &k, &g, "green 0").await;
    turn(&legacy, &k, &l, "legacy 0").await;
    let read = async |store: &RedisLedgerStore| store.read_state(&k).await.unwrap().unwrap();
    assert_eq!(
        (read(&blue).await.version, &read(&blue).await.payload[..]),
        (3, &b"blue 2"[..])
    );
    assert_eq!(
        (read(&green).await.version, &read(&green).await.payload[..]),
        (1, &b"green 0"[..])
    );
    assert_eq!(
        (
            read(&legacy).await.version,
            &read(&legacy).await.payload[..]
        ),
        (1, &b"legacy 0"[..])
    );
    // The legacy layout's keys are where they always were.
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let legacy_state: bool = ::redis::cmd("EXISTS")
        .arg(baton_store_redis::SessionKeys::new(&k).state)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(legacy_state);

    // Each ledger (a Postgres schema per namespace) has its own turns.
    for (store, turns) in [(&blue, 3), (&green, 1), (&legacy, 1)] {
        wait_until_async(Duration::from_secs(10), "the turns shipped", || async {
            store.ledger().turn_count(&k).await.unwrap() == turns
        })
        .await;
    }
    // Readers and replica lists see their own deployment only.
    let reader = RedisCatalog::connect_in(&redis.url(), &database, "prod.green")
        .await
        .unwrap();
    assert_eq!(reader.turns(&k, 10).await.unwrap().len(), 1);
    let ids = |r: Vec<ReplicaView>| r.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(reader.replicas().await.unwrap()), ["green-0"]);
    assert_eq!(ids(blue.replicas().await.unwrap()), ["blue-0"]);
    assert_eq!(ids(legacy.replicas().await.unwrap()), ["legacy-0"]);

    // Workspaces in one bucket (here a directory): same session, apart.
    let objects = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("notes.md"), "blue's").unwrap();
    let blue_ws = WorkspaceStore::local(objects.path())
        .unwrap()
        .in_namespace("prod.blue");
    let green_ws = WorkspaceStore::local(objects.path())
        .unwrap()
        .in_namespace("prod.green");
    let reference = blue_ws
        .snapshot(files.path(), &Manifest::default(), &k, 1, 1)
        .await
        .unwrap()
        .unwrap();
    assert!(
        reference.starts_with("baton@prod.blue/manifests/"),
        "{reference}"
    );
    assert_eq!(
        blue_ws.list_manifests().await.unwrap(),
        std::slice::from_ref(&reference)
    );
    assert!(green_ws.list_manifests().await.unwrap().is_empty());
    // Green's collector never touches blue's objects.
    let report = green_ws
        .gc(&Default::default(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!((report.manifests_deleted, report.blobs_deleted), (0, 0));
    assert_eq!(
        blue_ws
            .read_file(&reference, "notes.md")
            .await
            .unwrap()
            .unwrap(),
        "blue's"
    );
}
