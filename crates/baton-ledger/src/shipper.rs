//! The background shipper's identity and what it keeps in memory (the
//! known-index backfill in progress, what the last sweep settled): plain
//! state the store holds and `shipping.rs` and `known.rs` work on.

use baton_session::ids::SessionKey;

/// Wake-ups waiting for a replica's shipper; more are dropped (the sweep
/// ships them), so a Postgres outage cannot pile them up.
pub(crate) const WAKE_QUEUE: usize = 16_384;

/// The background shipper of a store opened with
/// [`RedisLedgerStore::connect`]: its identity for the sweeper lease, and
/// how to stop it.
#[derive(Default)]
pub(crate) struct Shipper {
    pub(crate) id: String,
    pub(crate) stop: tokio::sync::watch::Sender<bool>,
    pub(crate) done: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The known-index backfill in progress (the sweeper's, in memory: a
    /// new sweeper starts it over).
    pub(crate) known: tokio::sync::Mutex<Option<KnownBackfill>>,
    /// What the last sweep settled about the known index, for the runs
    /// (per bucket) answering then: while they answer, a sweep reads no
    /// watermark.
    pub(crate) known_settled: std::sync::Mutex<Option<KnownSettled>>,
    /// When (Unix ms) the oldest commit this process made that has not
    /// shipped yet was made; 0 when none waits. Set by a commit when 0,
    /// cleared when a round leaves the wake-up queue empty.
    pub(crate) oldest_unshipped_ms: std::sync::atomic::AtomicU64,
}

/// How far the known-index backfill of one Redis run has got: first the
/// sessions the unshipped index names (records the ledger may not have
/// yet), then every session the ledger knows.
pub(crate) struct KnownBackfill {
    /// The run of each bucket it marks for (one on a single server).
    pub(crate) runs: Vec<String>,
    pub(crate) step: BackfillStep,
}

pub(crate) enum BackfillStep {
    Unshipped { bucket: u16, cursor: u64 },
    Ledger { after: Option<SessionKey> },
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KnownSettled {
    /// Found complete for these runs.
    Complete(Vec<String>),
    /// Dropped under these runs: Redis may evict markers.
    Dropped(Vec<String>),
}
