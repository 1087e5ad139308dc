//! The Postgres turn ledger, and the production store built on it.
//!
//! - [`PostgresLedger`] (`postgres.rs`): every committed turn exactly once,
//!   per session its counters and a durable copy of its state. It knows
//!   nothing of Redis.
//! - [`RedisLedgerStore`] (`store.rs`): the production `TurnStore`, Redis
//!   (`baton-store-redis`) for the protocol and this ledger for durability.
//!   Beside it: `shipping.rs` (the shipper and the sweeper that move
//!   Redis's turn logs into the ledger) and `shipper.rs` (what they keep
//!   in memory), `recovery.rs` (the begin that asks the ledger: a session
//!   Redis lost, a state a restarted Redis may hold older than it
//!   acknowledged), `known.rs` (keeping Redis's known-session index
//!   complete).
//! - [`RedisCatalog`] (`catalog.rs`): the dashboard's read-only view of
//!   both, with no background work and no writes; the replica's store
//!   answers the same reads through it.
#![forbid(unsafe_code)]

mod catalog;
mod known;
mod postgres;
mod recovery;
mod shipper;
mod shipping;
mod store;

pub use catalog::RedisCatalog;
pub use postgres::PostgresLedger;
pub use shipping::{SWEEP_AFTER, SWEEP_INTERVAL};
pub use store::RedisLedgerStore;
