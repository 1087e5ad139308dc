//! What a backend hands to a ledger, and what a ledger keeps of a session:
//! plain data shared by the backends (the Redis store reads its logs into
//! [`ShipBatch`]es, restores from a [`DurableCopy`]) and the ledger that
//! stores them, so neither depends on the other for its types.

use bytes::Bytes;

use crate::ids::SessionKey;
use crate::model::TurnRecord;

/// The state of a session at one version, kept in Postgres.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableCopy {
    pub version: u64,
    pub payload: Bytes,
    pub workspace: Option<String>,
}

/// What the ledger knows of one session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerSession {
    pub key: SessionKey,
    pub last_version: u64,
    pub last_turn_seq: u64,
    pub last_fence: u64,
    pub last_replica: String,
    pub last_turn_at_ms: u64,
    pub turn_count: u64,
    pub durable: Option<DurableCopy>,
}

/// Turn records of one session shipped together, with the state as the
/// coordination store held it when they were read.
#[derive(Clone, Debug)]
pub struct ShipBatch {
    pub key: SessionKey,
    pub records: Vec<TurnRecord>,
    pub durable: Option<DurableCopy>,
    /// The Redis run that vouched for that state (its `run` field), if
    /// any: the ledger refuses the batch once a check has claimed the
    /// session for another run (see the ledger's `claim`).
    pub run: Option<String>,
}
