//! Requests and outcomes of the turn protocol, shared by every backend.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::ids::{ReplicaId, SessionKey};

/// Start a turn: take the session's lease and load its state.
#[derive(Clone, Debug)]
pub struct BeginRequest {
    pub key: SessionKey,
    pub replica: ReplicaId,
    /// The caller's turn sequence number for an idempotent retry; `None`
    /// lets the runtime assign `last + 1`.
    pub turn_seq: Option<u64>,
    /// The state version the caller already holds; its payload is then not
    /// sent. A state emptied after its TTL never comes back under the
    /// version it had: with the ledger and on SQLite it takes the next one.
    /// (Redis alone keeps nothing of an expired session: it starts again at
    /// version 0, and later commits reach the old numbers again.)
    pub cached_version: Option<u64>,
    pub lease_ttl: Duration,
    /// How long a session created by this turn lives if it never commits.
    pub state_ttl: Duration,
    /// The caller runs no other turn of this session under `replica` (the
    /// sidecar's in-flight registry guarantees it), so a lease `replica`
    /// holds is an orphan, left by a grant whose answer was lost or a turn
    /// that died before releasing it: take it over at once rather than
    /// answer BUSY naming the caller itself for a whole lease TTL.
    pub reclaim_own_lease: bool,
    /// The digest of this turn's input ([`crate::turn_record::digest`]): a
    /// retried turnSeq whose record was committed with another input is
    /// answered TURN_SEQ_REUSED instead of that input's reply. `None`
    /// compares nothing.
    pub input_digest: Option<String>,
}

/// The right to run one turn, identified by its fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub key: SessionKey,
    pub replica: ReplicaId,
    /// Monotonic per session: every grant gets a larger one, so a holder
    /// that was fenced out can be told from the current one.
    pub fence: u64,
    pub turn_seq: u64,
    /// The state version the turn starts from (and must commit on top of).
    pub version: u64,
}

/// How a running turn's lease stands ([`crate::TurnStore::check_lease`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseCheck {
    /// Still this turn's, unexpired.
    Held,
    /// Still this turn's, and a reader wants its stream
    /// ([`crate::turn_stream::TurnStreamReader::want_events`]): the turn's
    /// events should go to the store from now on.
    Followed,
    /// Dropped by an interrupt ([`crate::TurnStore::interrupt`]).
    Interrupted,
    /// Expired, taken over, or released.
    Lost,
}

/// The session state a granted turn starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionState {
    pub version: u64,
    /// `None` when the caller's cached version is current.
    pub payload: Option<Bytes>,
    /// Reference to the workspace manifest of this version.
    pub workspace: Option<String>,
}

/// The stored result of a committed turn, returned again for a retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnResult {
    pub turn_seq: u64,
    /// The state version this turn produced.
    pub version: u64,
    pub reply: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BeginOutcome {
    Granted {
        lease: Lease,
        state: SessionState,
    },
    /// This turn already committed: its stored result, not a re-run.
    Duplicate(TurnResult),
    /// Another turn holds the lease.
    Busy {
        owner: String,
        retry_after: Duration,
    },
    /// The caller's turnSeq skips ahead; the next one expected is given.
    Gap {
        next_turn_seq: u64,
    },
    /// The turnSeq committed long ago and its result is no longer retained.
    Stale {
        last_turn_seq: u64,
    },
    /// The turnSeq committed with another input: a key reused for a
    /// different request (the IETF Idempotency-Key draft answers 422).
    TurnSeqReused {
        turn_seq: u64,
    },
    /// The coordination store lost this session and the ledger, which knows
    /// it reached `last_version`, has no copy of its state to restore.
    StateLost {
        last_version: u64,
    },
}

/// Finish a turn: write the new state on top of the lease's version.
#[derive(Clone, Debug)]
pub struct CommitRequest {
    pub lease: Lease,
    /// The version the write must apply to; normally `lease.version`.
    pub expected_version: u64,
    pub payload: Bytes,
    pub workspace: Option<String>,
    pub reply: Bytes,
    /// The state (and the idempotency records) live this long after the commit.
    pub state_ttl: Duration,
    /// When the turn began, for the turn record.
    pub started_at_ms: u64,
    /// Digest of the turn's input, for the turn record.
    pub input_digest: String,
    /// The turn's input, when the ledger keeps what was said
    /// (`spec.ledger.content: full`): the turn record then holds it and the
    /// reply beside their digests. `None`: digests alone.
    pub input: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed {
        version: u64,
    },
    /// The lease expired or was taken over: nothing was written.
    LeaseLost,
    /// The state moved on: nothing was written.
    Conflict {
        current_version: u64,
    },
}

/// One committed turn, as appended to the session's log and shipped to the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub tenant: String,
    pub session: String,
    pub turn_seq: u64,
    pub version: u64,
    pub replica: String,
    pub fence: u64,
    pub input_digest: String,
    pub reply_digest: String,
    pub workspace: Option<String>,
    pub started_at_ms: u64,
    pub committed_at_ms: u64,
    /// What was said, when the ledger keeps it (see
    /// [`CommitRequest::input`]); records written with digests alone, or
    /// before the ledger kept text, have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// A turn an interrupt stopped (`?onBusy=interrupt`, a Stop): kept in
    /// the history with its input, never committed. `version` is the one it
    /// started from, `committed_at_ms` when it stopped, and it has no reply.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// A committed version of a session's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedState {
    pub version: u64,
    pub payload: Bytes,
    pub workspace: Option<String>,
}

/// The live view of one session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionView {
    pub key: SessionKey,
    pub version: u64,
    pub fence: u64,
    pub last_turn_seq: u64,
    pub last_replica: Option<String>,
    pub updated_at_ms: u64,
    pub workspace: Option<String>,
    pub lease: Option<LeaseView>,
}

pub use baton_views::LeaseView;

impl TurnRecord {
    /// The record as the APIs show it.
    pub fn to_view(&self) -> baton_views::TurnView {
        baton_views::TurnView {
            turn_seq: self.turn_seq,
            version: self.version,
            replica: self.replica.clone(),
            fence: self.fence,
            input_digest: self.input_digest.clone(),
            reply_digest: self.reply_digest.clone(),
            workspace: self.workspace.clone(),
            started_at_ms: self.started_at_ms,
            committed_at_ms: self.committed_at_ms,
            input: self.input.clone(),
            reply: self.reply.clone(),
            interrupted: self.interrupted,
        }
    }
}

impl SessionView {
    /// The session as the APIs show it, with its recent `turns` (newest
    /// first) and, when asked for, its committed state.
    pub fn to_view(
        &self,
        turns: &[TurnRecord],
        state: Option<baton_views::StateView>,
    ) -> baton_views::SessionView {
        baton_views::SessionView {
            tenant: self.key.tenant.to_string(),
            session: self.key.session.to_string(),
            version: self.version,
            fence: self.fence,
            last_turn_seq: self.last_turn_seq,
            last_replica: self.last_replica.clone(),
            updated_at_ms: self.updated_at_ms,
            workspace: self.workspace.clone(),
            lease: self.lease.clone(),
            turns: turns.iter().map(TurnRecord::to_view).collect(),
            state,
        }
    }
}

impl SessionPage {
    /// The page as the APIs show it.
    pub fn to_view(&self) -> baton_views::SessionPage {
        baton_views::SessionPage {
            sessions: self
                .sessions
                .iter()
                .map(|s| baton_views::SessionSummary {
                    tenant: s.key.tenant.to_string(),
                    session: s.key.session.to_string(),
                    version: s.version,
                    last_turn_seq: s.last_turn_seq,
                    last_replica: s.last_replica.clone(),
                    last_turn_at_ms: s.last_turn_at_ms,
                    turn_count: s.turn_count,
                })
                .collect(),
            next: self.next.as_ref().map(|k| baton_views::PageKey {
                tenant: k.tenant.to_string(),
                session: k.session.to_string(),
            }),
        }
    }
}

/// Longest page [`ListQuery`] returns.
pub const MAX_PAGE: u32 = 500;

/// A page of sessions in (tenant, session) order, after `after`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub tenant: Option<crate::ids::TenantId>,
    /// Only sessions whose id starts with this.
    pub prefix: Option<String>,
    /// Only sessions whose last turn ran on a holder whose id starts with
    /// this (a replica's name: holders are `<replica>-<suffix>`).
    pub replica: Option<String>,
    /// Keyset pagination: the last key of the previous page.
    pub after: Option<SessionKey>,
    /// 1..=[`MAX_PAGE`]; larger values are clamped.
    pub limit: u32,
}

/// One row of the session list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    pub key: SessionKey,
    pub version: u64,
    pub last_turn_seq: u64,
    pub last_replica: Option<String>,
    pub last_turn_at_ms: u64,
    pub turn_count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionPage {
    pub sessions: Vec<SessionSummary>,
    /// Pass as `after` for the next page; `None` on the last one.
    pub next: Option<SessionKey>,
}

pub use baton_views::{ReplicaInfo, ReplicaView};
