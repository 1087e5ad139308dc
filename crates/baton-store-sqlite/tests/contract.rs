//! The contract suite and the dashboard's reads on the embedded SQLite
//! store (a fresh file per test).

use baton_store_sqlite::SqliteStore;

async fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("baton.db"))
        .await
        .unwrap();
    (dir, store)
}

baton_session_contract::contract_suite!(sqlite, crate::store, baton_session::protocol::RESULTS_RETAINED, keeps_counters: true);

mod catalog {
    baton_session_contract::catalog_suite!(sqlite, crate::store);
}
