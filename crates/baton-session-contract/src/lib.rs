//! The contract every `TurnStore` meets, as a harness each backend's tests
//! run: the Dapr state-store conformance cases mapped onto the turn
//! protocol, plus leases, fencing, idempotency, gaps, expiry and failover
//! ([`cases`]), and the dashboard's reads for the backends that keep a
//! ledger. A backend's `tests/contract.rs` names a constructor and gets one
//! test per case:
//!
//! ```ignore
//! async fn store() -> (tempfile::TempDir, SqliteStore) { … }
//! baton_session_contract::contract_suite!(
//!     sqlite,
//!     crate::store,
//!     baton_session::protocol::RESULTS_RETAINED,
//!     keeps_counters: true
//! );
//! ```
//!
//! The constructor returns whatever keeps its servers alive with the store.
//! `keeps_counters`: whether a session whose state expired keeps its
//! turnSeq and fence (a backend with a ledger does; Redis alone forgets).
//! [`servers`] has the Postgres cluster and Redis Cluster a test binary's
//! cases share.

pub mod cases;
pub mod servers;

/// One `#[tokio::test]` per contract case, in a module named `$backend`,
/// each on a store from `$make`.
#[macro_export]
macro_rules! contract_suite {
    ($backend:ident, $make:path, $window:expr, keeps_counters: $keeps:expr) => {
        mod $backend {
            use $crate::cases;

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
            case!(an_interrupt_fences_out_the_running_turn_and_tells_it_why);
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
            case!(a_turns_stream_keeps_its_order_and_refuses_an_older_attempt);
            case!(a_reader_that_wants_a_turns_stream_is_heard_at_its_lease_check);

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

/// One `#[tokio::test]` per catalog case (listing, history, replicas), in
/// a module named `$backend`, each on a store from `$make`.
#[macro_export]
macro_rules! catalog_suite {
    ($backend:ident, $make:path) => {
        mod $backend {
            use $crate::cases;

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
            case!(the_history_keeps_what_was_said_and_forgets_past_the_retention);
            case!(replicas_are_listed_while_they_heartbeat);
        }
    };
}
