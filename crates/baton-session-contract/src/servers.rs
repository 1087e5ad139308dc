//! Servers the tests of one binary share (a Postgres cluster with a
//! database per test, a Redis Cluster with a namespace per test), and a
//! private pair a test may stop, restart or reconfigure.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use baton_testkit::{PostgresServer, RedisCluster, RedisServer};

static POSTGRES: OnceLock<PostgresServer> = OnceLock::new();
static DATABASES: AtomicU32 = AtomicU32::new(0);

/// A fresh database on the shared cluster.
pub fn database() -> String {
    let server = POSTGRES.get_or_init(PostgresServer::start);
    server.create_database(&format!("t{}", DATABASES.fetch_add(1, Ordering::SeqCst)))
}

/// The Redis Cluster (3 masters, a replica each) shared by the tests of
/// this binary; each test keeps to a store namespace of its own.
pub fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 1))
}

/// A store namespace no other test of this binary uses.
pub fn namespace() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("t{}", NEXT.fetch_add(1, Ordering::SeqCst))
}

/// Private Redis and Postgres servers, which a test may stop, restart or
/// reconfigure, with one database for the ledger.
pub struct Private {
    pub redis: RedisServer,
    pub postgres: PostgresServer,
    pub database: String,
}

impl Private {
    pub fn start(database: &str) -> Self {
        Self::start_with(database, false)
    }

    /// With Redis persisting to an append-only file (`appendonly`), so
    /// that a restart loads what it had.
    pub fn start_with(database: &str, appendonly: bool) -> Self {
        let redis = RedisServer::start_with(appendonly);
        let postgres = PostgresServer::start();
        let database = postgres.create_database(database);
        Self {
            redis,
            postgres,
            database,
        }
    }

    /// A connection for the test itself (CONFIG, INFO, reading keys).
    pub async fn admin(&self) -> ::redis::aio::MultiplexedConnection {
        baton_testkit::redis_admin(&self.redis.url()).await
    }
}
