//! The contract suite, run against every backend: Redis alone (a real
//! `redis-server` per test), Redis with the Postgres ledger (plus a database
//! on a shared Postgres cluster), both again on a Redis Cluster of three
//! masters with a replica each (shared by the tests, a store namespace
//! each), and the embedded SQLite store (a fresh file per test).

mod cases;
#[allow(dead_code)]
mod ledgered;

macro_rules! contract_suite {
    ($backend:ident, $make:path, $window:expr, keeps_counters: $keeps:expr) => {
        mod $backend {
            use super::cases;

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        let (_server, store) = $make().await;
                        cases::$name(store).await;
                    }
                };
            }

            case!(new_session_gets_a_version);
            case!(read_state_returns_the_committed_version);
            case!(stale_version_is_rejected_and_nothing_written);
            case!(correct_version_succeeds_and_bumps);
            case!(create_if_absent_only_once);
            case!(replaying_an_old_commit_fails);
            case!(concurrent_begins_grant_exactly_one_lease);
            case!(release_by_a_non_owner_is_a_no_op);
            case!(renew_by_a_non_owner_fails);
            case!(fences_only_grow);
            case!(an_expired_lease_is_free);
            case!(a_dead_replicas_lease_is_free_once_its_heartbeat_stops);
            case!(an_orphaned_lease_of_ones_own_is_reclaimed_at_once);
            case!(revoke_fences_out_the_holder);
            case!(a_duplicate_turn_seq_returns_the_stored_result);
            case!(a_duplicate_wins_over_busy);
            case!(a_turn_seq_reused_with_another_input_is_refused);
            case!(a_gap_in_turn_seq_is_refused);
            case!(a_cached_version_skips_the_payload);
            case!(state_expires_after_its_ttl);
            case!(a_running_turn_outlives_the_state_ttl);
            case!(tenants_are_separate);
            case!(workspace_refs_travel_with_the_state);
            case!(oversized_commits_are_refused_and_nothing_is_overwritten);
            case!(a_commit_cannot_move_its_turn_seq);

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn results_older_than_the_window_are_stale() {
                let (_server, store) = $make().await;
                cases::results_older_than_the_window_are_stale(store, $window).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_cached_version_is_not_reused_after_the_state_expires() {
                let (_server, store) = $make().await;
                cases::a_cached_version_is_not_reused_after_the_state_expires(store, $keeps).await;
            }
        }
    };
}

async fn redis_store() -> (baton_testkit::RedisServer, baton_session::redis::RedisStore) {
    let server = baton_testkit::RedisServer::start();
    let store = baton_session::redis::RedisStore::connect(&server.url())
        .await
        .unwrap();
    (server, store)
}

contract_suite!(
    redis,
    crate::redis_store,
    baton_session::redis::RESULTS_RETAINED,
    keeps_counters: false
);

async fn sqlite_store() -> (tempfile::TempDir, baton_session::sqlite::SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = baton_session::sqlite::SqliteStore::open(&dir.path().join("baton.db"))
        .await
        .unwrap();
    (dir, store)
}

contract_suite!(
    sqlite,
    crate::sqlite_store,
    baton_session::sqlite::RESULTS_RETAINED,
    keeps_counters: true
);

contract_suite!(
    redis_ledger,
    crate::ledgered::store,
    baton_session::redis::RESULTS_RETAINED,
    keeps_counters: true
);

// On a Redis Cluster of 3 masters with a replica each.
contract_suite!(
    redis_cluster,
    crate::ledgered::cluster_store,
    baton_session::redis::RESULTS_RETAINED,
    keeps_counters: false
);

contract_suite!(
    redis_ledger_cluster,
    crate::ledgered::cluster_ledgered_store,
    baton_session::redis::RESULTS_RETAINED,
    keeps_counters: true
);

macro_rules! catalog_suite {
    ($backend:ident, $make:path) => {
        mod $backend {
            use crate::cases;

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        let (_server, store) = $make().await;
                        cases::$name(store).await;
                    }
                };
            }

            case!(sessions_list_in_key_order_page_by_page);
            case!(turn_history_is_newest_first);
            case!(replicas_are_listed_while_they_heartbeat);
        }
    };
}

/// The dashboard's reads, on the backends that have a ledger.
mod catalog {
    catalog_suite!(sqlite, crate::sqlite_store);
    catalog_suite!(redis_ledger, crate::ledgered::store);
    catalog_suite!(
        redis_ledger_cluster,
        crate::ledgered::cluster_ledgered_store
    );
}
