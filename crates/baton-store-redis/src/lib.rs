//! The Redis backend: the production hot path.
//!
//! Every protocol step is one Lua script over the keys of one session, which
//! share a hash tag (`baton:{tenant:session}:…`) so each script touches one
//! Redis Cluster slot. A session is three keys: the state hash (counters,
//! the lease, idempotency records: one HMGET reads what a step needs, one
//! HSET writes it), the payload, and the log of unshipped turn records.
//!
//! An uncontended turn is two round trips: `begin.lua` pipelined with a GET
//! of the payload, then a PSETEX staging the new payload pipelined with
//! `commit.lua`, which renames it into place. The payload
//! never passes through Lua, where bulk strings are expensive. Scripts are
//! sent by SHA and loaded when Redis answers NOSCRIPT (after a restart), then
//! the pipeline runs again: NOSCRIPT never surfaces as an outcome.
//!
//! Replica liveness lives in `baton:hb:<replica>` keys with a short TTL. They
//! sit on other slots, so `begin.lua` cannot read them: when it answers BUSY,
//! the caller checks the owner's heartbeat and, if it is gone, calls
//! `begin.lua` again naming the dead owner and its fence. Only that failover
//! path costs extra round trips.
//!
//! Nothing walks the keyspace: two sorted sets index what the background
//! work needs. `baton:unshipped` holds the sessions whose logs may hold
//! unshipped records (a ledgered commit adds its session in the same
//! pipeline, before the record), `baton:replicas` the replicas by when
//! their heartbeat expires.
//!
//! With a ledger, a fourth key per session, its "known" marker, lets a
//! brand-new session start while Postgres is down (`known.rs`).
//!
//! Where to look: `store.rs` (the store and the turn protocol's steps),
//! `scripts.rs` (the Lua scripts, `scripts/*.lua`, and NOSCRIPT after a
//! restart), `raw.rs` and `ledgered.rs` (what the steps answer before
//! a missing state is judged, and the steps a store with a ledger builds
//! on: `baton-ledger`'s), `runs.rs` (which Redis run vouched for a state),
//! `replicas.rs` (heartbeats and the live replica list), `keys.rs` (the key
//! layout and namespaces), `reply.rs` (script replies, idempotency records),
//! `shipping.rs` (what the ledger shipper and the sweeper read and write,
//! the singleton leases), `known.rs` (the known-session index), `conn.rs`
//! (one server or a cluster, through `baton-redis-cluster`).
#![forbid(unsafe_code)]

mod conn;
mod errors;
mod keys;
mod known;
mod ledgered;
mod raw;
mod replicas;
mod reply;
mod runs;
mod scripts;
mod shipping;
mod store;
mod streams;

pub use baton_redis_cluster::slots;
pub use baton_session::protocol::RESULTS_RETAINED;
pub use conn::{CLUSTER_SCHEME, RedisTarget, requests_sent};
pub use keys::{KeySpace, SessionKeys, UNSHIPPED_INDEX};
pub use known::KnownIndexCheck;
pub use raw::{LeaseRun, OnMissing, RawBegin, RawCommit};
pub use shipping::Unshipped;
pub use store::RedisStore;
