//! The session runtime: the turn protocol every replica uses to run a turn
//! safely — a lease with fencing, versioned compare-and-swap of the session
//! state, idempotent turns and a turn log. It knows nothing of Kubernetes or
//! HTTP.
//!
//! Backends implement [`TurnStore`]: [`redis::RedisStore`] for production and
//! [`sqlite::SqliteStore`] for one machine with no servers.
#![forbid(unsafe_code)]

pub mod catalog;
#[cfg(feature = "cli")]
pub mod cli;
pub mod collector;
pub mod id_encoding;
pub mod ids;
pub mod ledger;
pub mod model;
pub mod protocol;
pub mod redis;
pub mod redis_ledger;
mod sql;
pub mod sqlite;
pub mod store;
pub mod turn_record;
pub mod workspace;

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
    MAX_PAYLOAD_BYTES, MAX_REPLY_BYTES, SessionCatalog, StoreError, StoreResult, TurnStore,
    WorkspaceRoots,
};
