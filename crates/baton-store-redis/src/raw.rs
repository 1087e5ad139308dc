//! What a protocol step answers before anyone decided what a missing or
//! unverified state means: Redis alone decides at once (a missing state
//! is a new session), a store with a ledger asks the ledger first.

use baton_session::model::{BeginOutcome, CommitOutcome};

/// What `begin` does when the session has no state at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnMissing<'a> {
    /// Start a new session (Redis alone, no ledger to ask).
    Create,
    /// Answer [`RawBegin::Missing`] so the caller can ask the ledger, and
    /// [`RawBegin::Unverified`] for a state this Redis run has not vouched
    /// for (it may have come back from disk older than the ledger).
    Report,
    /// As `Report`, but start the session when it has no "known" marker
    /// and Redis is still `run`, whose known index the caller found
    /// complete: then the ledger cannot know it (see `known.rs`).
    CreateUnknown { run: &'a str },
}

/// Which leases `commit` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseRun {
    /// Any valid lease (Redis alone: nothing to check a state against).
    Any,
    /// Only one granted by this run of Redis (with a ledger): after a
    /// restart Redis may have come back older, with a lease alive again in a
    /// state the ledger has moved past (see `begin.lua`, UNVERIFIED).
    ThisRun,
}

pub enum RawBegin {
    Outcome(BeginOutcome),
    /// The session has no state; `run` is the Redis run that said so, and
    /// `known` whether it has a marker: a ledgered commit or a restore
    /// wrote it some time (see `known.rs`).
    Missing {
        run: String,
        known: bool,
    },
    /// The session has state at `version` that no one has checked against
    /// the ledger since Redis (re)started as `run`.
    Unverified {
        version: u64,
        run: String,
    },
}

/// What `commit.lua` answered.
pub enum RawCommit {
    Outcome(CommitOutcome),
    /// (This-run mode.) The lease holds, but the state it was granted on
    /// (now at `version`) was vouched for by another Redis run than `run`,
    /// the one answering: the caller was granted it on a stale idea of the
    /// run, and checks it against the ledger before committing again.
    Unverified {
        version: u64,
        run: String,
    },
}
