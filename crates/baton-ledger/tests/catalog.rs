//! The dashboard's reader reads: it lists sessions, turns and replicas,
//! ships nothing, writes nothing to Redis and migrates nothing.

use baton_session_contract::cases;

use std::collections::HashMap;
use std::time::Duration;

use baton_ledger::RedisCatalog;
use baton_ledger::RedisLedgerStore;
use baton_session::*;
use baton_testkit::{PostgresServer, RedisServer, wait_until_async};
use cases::{key, replica, turn};

async fn calls(admin: &mut ::redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    baton_testkit::redis_command_calls(admin).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_reads_and_never_ships_or_writes() {
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    // Never migrated: the reader must not create the ledger's tables.
    let empty = postgres.create_database("never_migrated");
    let reader = RedisCatalog::connect(&redis.url(), &empty).await.unwrap();
    assert!(
        reader
            .list_sessions(&ListQuery {
                limit: 10,
                ..ListQuery::default()
            })
            .await
            .is_err()
    );
    let pool = sqlx::PgPool::connect(&empty).await.unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 0, "the reader created tables");

    let database = postgres.create_database("catalog");
    let writer = RedisLedgerStore::connect(&redis.url(), &database)
        .await
        .unwrap();
    let a = replica(&writer, "a").await;
    for (session, turns) in [("one", 2), ("two", 1)] {
        for i in 0..turns {
            turn(&writer, &key(session), &a, &format!("t{i}")).await;
        }
    }
    wait_until_async(Duration::from_secs(10), "the turns shipped", || async {
        writer.ledger().turn_count(&key("one")).await.unwrap() == 2
            && writer.ledger().turn_count(&key("two")).await.unwrap() == 1
    })
    .await;
    writer.stop_shipping().await;
    // A turn nobody ships now: the reader must leave it in Redis.
    turn(&writer, &key("two"), &a, "unshipped").await;

    let reader = RedisCatalog::connect(&redis.url(), &database)
        .await
        .unwrap();
    let mut admin = baton_testkit::redis_admin(&redis.url()).await;
    let before = calls(&mut admin).await;
    let page = reader
        .list_sessions(&ListQuery {
            limit: 10,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.sessions
            .iter()
            .map(|s| s.key.session.as_str())
            .collect::<Vec<_>>(),
        ["one", "two"]
    );
    assert_eq!(reader.turns(&key("one"), 10).await.unwrap().len(), 2);
    let view = reader.inspect(&key("two")).await.unwrap().unwrap();
    assert_eq!(view.version, 2);
    assert_eq!(
        reader
            .inspect_state(&key("two"))
            .await
            .unwrap()
            .unwrap()
            .version,
        2
    );
    let replicas = reader.replicas().await.unwrap();
    assert_eq!(
        replicas.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    let after = calls(&mut admin).await;
    let ran: Vec<&String> = after
        .iter()
        .filter(|(c, n)| before.get(*c).copied().unwrap_or(0) < **n)
        .map(|(c, _)| c)
        .collect();
    let reads = [
        "info", "hmget", "time", "get", "zrange", "mget", "multi", "exec",
    ];
    assert!(
        ran.iter().all(|c| reads.contains(&c.as_str())),
        "the reader ran more than reads: {ran:?}"
    );
    // The unshipped turn is still waiting in Redis.
    let waiting: u64 = ::redis::cmd("LLEN")
        .arg(baton_store_redis::SessionKeys::new(&key("two")).log)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(waiting, 1);
}
