//! A Postgres cluster shared by the tests of this binary, one database each.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use baton_testkit::{PostgresServer, RedisServer};

static POSTGRES: OnceLock<PostgresServer> = OnceLock::new();
static DATABASES: AtomicU32 = AtomicU32::new(0);

/// A fresh database on the shared cluster.
pub fn database() -> String {
    let server = POSTGRES.get_or_init(PostgresServer::start);
    server.create_database(&format!("t{}", DATABASES.fetch_add(1, Ordering::SeqCst)))
}

pub async fn store() -> (RedisServer, baton_session::redis_ledger::RedisLedgerStore) {
    let redis = RedisServer::start();
    let store = baton_session::redis_ledger::RedisLedgerStore::connect(&redis.url(), &database())
        .await
        .unwrap();
    (redis, store)
}
