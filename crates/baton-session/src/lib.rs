//! The session runtime: the turn protocol every replica uses to run a turn
//! safely — a lease with fencing, versioned compare-and-swap of the session
//! state, idempotent turns and a turn log. It knows nothing of Kubernetes or
//! HTTP.
//!
//! This crate holds the rules and the types; the backends are crates of
//! their own that implement [`TurnStore`] (and [`SessionCatalog`] where
//! they can list sessions): `baton-store-redis` (the protocol on Redis),
//! `baton-ledger` (the Postgres ledger, and the production store: Redis
//! with that ledger), `baton-store-sqlite` (one machine, no servers).
//! Workspace files are `baton-workspace`'s. `baton-session-contract` is
//! the suite every backend runs.
#![forbid(unsafe_code)]

pub mod durable;
pub mod id_encoding;
pub mod ids;
pub mod model;
pub mod protocol;
#[cfg(feature = "sql")]
pub mod sql;
pub mod store;
pub mod turn_record;
pub mod turn_stream;

/// The layout of what replicas write to Redis and the ledger. Replicas of
/// two layouts must not share a Redis (an older one does not keep the newer
/// one's indexes), so a rollout compares it before mixing builds.
///
/// - 1: before the indexes of unshipped logs and known sessions (issue 13).
/// - 2: with them.
pub const DATA_LAYOUT: u32 = 2;

pub use ids::{InvalidId, ReplicaId, SessionId, SessionKey, TenantId};
pub use model::*;
pub use store::{
    LedgerRetention, MAX_PAYLOAD_BYTES, MAX_REPLY_BYTES, SessionCatalog, StoreError, StoreResult,
    TurnStore, WorkspaceRoots,
};
