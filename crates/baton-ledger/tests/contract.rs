//! The contract suite and the dashboard's reads on the production store,
//! Redis with the Postgres ledger: on a Redis per test (a database each
//! on a shared Postgres), and on a shared Redis Cluster of three masters
//! with a replica each (a store namespace each).

mod ledgered;

baton_session_contract::contract_suite!(redis_ledger, crate::ledgered::store, baton_session::protocol::RESULTS_RETAINED, keeps_counters: true);

baton_session_contract::contract_suite!(
    redis_ledger_cluster,
    crate::ledgered::cluster_store,
    baton_session::protocol::RESULTS_RETAINED,
    keeps_counters: true
);

mod catalog {
    baton_session_contract::catalog_suite!(redis_ledger, crate::ledgered::store);
    baton_session_contract::catalog_suite!(redis_ledger_cluster, crate::ledgered::cluster_store);
}
