//! A rollback runs an older build against the schema a newer one migrated.
//! Here the "newer build" is simulated the way it would leave a database:
//! one more applied migration this build does not know (recorded in sqlx's
//! table, as sqlx records it) that added a nullable column. This build must
//! start, run turns and ship them, on Postgres and on SQLite.

use baton_session_contract::cases;

use std::time::Duration;

use baton_ledger::RedisLedgerStore;
use baton_store_sqlite::SqliteStore;
use baton_testkit::{PostgresServer, RedisServer, wait_until_async};
use cases::{key, replica, turn};

/// What a newer build's migration leaves: its row in `_sqlx_migrations`
/// (`checksum` a blob: SQLite's literal, then Postgres').
fn newer(checksum: &str) -> String {
    format!(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'a newer build adds a column', TRUE, {checksum}, 1)"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_build_starts_against_a_newer_ledger_schema() {
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let database = postgres.create_database("rollback");
    let first = RedisLedgerStore::connect(&redis.url(), &database)
        .await
        .unwrap();
    let a = replica(&first, "a").await;
    turn(&first, &key("s"), &a, "t1").await;
    first.stop_shipping().await;

    let pool = sqlx::PgPool::connect(&database).await.unwrap();
    sqlx::query("ALTER TABLE turns ADD COLUMN added_by_a_newer_build TEXT")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(&newer("decode('00', 'hex')"))
        .execute(&pool)
        .await
        .unwrap();

    // This build again: it starts, commits, ships.
    let again = RedisLedgerStore::connect(&redis.url(), &database)
        .await
        .expect("an older build starts against a newer schema");
    turn(&again, &key("s"), &a, "t2").await;
    wait_until_async(
        Duration::from_secs(10),
        "both turns in the ledger",
        || async { again.ledger().turn_count(&key("s")).await.unwrap() == 2 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_build_starts_against_a_newer_sqlite_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("baton.db");
    let first = SqliteStore::open(&path).await.unwrap();
    let a = replica(&first, "a").await;
    turn(&first, &key("s"), &a, "t1").await;
    drop(first);
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("ALTER TABLE turns ADD COLUMN added_by_a_newer_build TEXT")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(&newer("X'00'")).execute(&pool).await.unwrap();
    pool.close().await;

    let again = SqliteStore::open(&path)
        .await
        .expect("an older build starts against a newer schema");
    assert_eq!(turn(&again, &key("s"), &a, "t2").await, 2);
}
