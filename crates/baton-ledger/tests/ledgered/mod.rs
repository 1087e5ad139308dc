//! The production store on the servers `baton_session_contract::servers`
//! shares, for this crate's test binaries.

#![allow(dead_code)]

use baton_ledger::RedisLedgerStore;
pub use baton_session_contract::servers::{Private, cluster, database, namespace};
use baton_testkit::RedisServer;

/// On a Redis of its own and a fresh database of the shared Postgres.
pub async fn store() -> (RedisServer, RedisLedgerStore) {
    let redis = RedisServer::start();
    let store = RedisLedgerStore::connect(&redis.url(), &database())
        .await
        .unwrap();
    (redis, store)
}

/// On the shared Redis Cluster, in a namespace of its own.
pub async fn cluster_store() -> ((), RedisLedgerStore) {
    let store = RedisLedgerStore::connect_in(&cluster().url(), &database(), &namespace())
        .await
        .unwrap();
    ((), store)
}

/// A replica's store on `servers`, its shipper running.
pub async fn replica_store(servers: &Private) -> RedisLedgerStore {
    RedisLedgerStore::connect(&servers.redis.url(), &servers.database)
        .await
        .unwrap()
}
