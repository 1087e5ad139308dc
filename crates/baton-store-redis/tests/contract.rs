//! The contract suite on Redis alone: a real `redis-server` per test, and a
//! Redis Cluster of three masters with a replica each (shared by the
//! tests, a store namespace each).

use baton_session_contract::servers::{cluster, namespace};
use baton_store_redis::{KeySpace, RedisStore};

async fn server_store() -> (baton_testkit::RedisServer, RedisStore) {
    let server = baton_testkit::RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    (server, store)
}

async fn cluster_store() -> ((), RedisStore) {
    let store = RedisStore::connect_in(&cluster().url(), KeySpace::new(&namespace()))
        .await
        .unwrap();
    assert!(store.is_cluster());
    ((), store)
}

baton_session_contract::contract_suite!(redis, crate::server_store, baton_session::protocol::RESULTS_RETAINED, keeps_counters: false);

baton_session_contract::contract_suite!(
    redis_cluster,
    crate::cluster_store,
    baton_session::protocol::RESULTS_RETAINED,
    keeps_counters: false
);
