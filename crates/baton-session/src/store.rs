//! The one surface every backend offers, so the sidecar and the dashboard
//! never know which one runs.

use std::future::Future;
use std::time::Duration;

use crate::ids::{InvalidId, ReplicaId, SessionKey};
use crate::model::{
    BeginOutcome, BeginRequest, CommitOutcome, CommitRequest, Lease, ListQuery, ReplicaInfo,
    ReplicaView, SessionPage, SessionSummary, SessionView, TurnRecord,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer or refused the connection: retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with something the protocol never writes.
    #[error("store returned malformed data: {0}")]
    Corrupt(String),
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// Refused before touching any store.
    #[error("{what} is {size} bytes; the limit is {limit}")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
}

impl StoreError {
    /// A bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Corrupt(_) => "corrupt",
            Self::InvalidId(_) => "invalid_id",
            Self::TooLarge { .. } => "too_large",
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The turn protocol's storage operations. Each is atomic on its own.
pub trait TurnStore: Send + Sync {
    /// Dedup check, lease check, lease grant with a new fence, state load.
    fn begin(&self, req: &BeginRequest) -> impl Future<Output = StoreResult<BeginOutcome>> + Send;

    /// Extends the lease if it is still `lease`'s (same fence). False when fenced out.
    fn renew(&self, lease: &Lease, ttl: Duration)
    -> impl Future<Output = StoreResult<bool>> + Send;

    /// Fence check, version check, write, idempotency record, turn record, release.
    fn commit(
        &self,
        req: &CommitRequest,
    ) -> impl Future<Output = StoreResult<CommitOutcome>> + Send;

    /// Releases the lease without writing, if it is still `lease`'s.
    fn abort(&self, lease: &Lease) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Takeover: revokes whatever lease the session has and bumps its fence,
    /// so the holder can no longer commit. Returns the revoked owner.
    fn revoke(&self, key: &SessionKey) -> impl Future<Output = StoreResult<Option<String>>> + Send;

    /// Interrupts the turn running on `key` (only if it runs `turn_seq`,
    /// when given): drops its lease and bumps the fence, as a takeover
    /// does, and marks the session with the interrupted lease's fence so
    /// that its holder learns why it lost it ([`Self::check_lease`]).
    /// Returns the lease interrupted; `None` when no unexpired lease (of
    /// that turn) was held.
    fn interrupt(
        &self,
        key: &SessionKey,
        turn_seq: Option<u64>,
    ) -> impl Future<Output = StoreResult<Option<crate::model::LeaseView>>> + Send;

    /// Whether `lease` still holds, and if not, whether it was interrupted.
    /// A read: a running turn asks often, to stop soon after an interrupt.
    fn check_lease(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = StoreResult<crate::model::LeaseCheck>> + Send;

    /// Keeps a turn an interrupt stopped in the session's history
    /// (`turn.interrupted`). A store without a history keeps nothing.
    fn record_interrupted(
        &self,
        turn: &TurnRecord,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let _ = turn;
        std::future::ready(Ok(()))
    }

    /// Marks `replica` alive for `ttl`. A lease whose owner stopped
    /// heartbeating counts as expired.
    fn heartbeat(
        &self,
        replica: &ReplicaId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        self.heartbeat_with(replica, ReplicaInfo::default(), ttl)
    }

    /// [`Self::heartbeat`], with what the replica says of itself (shown by
    /// [`SessionCatalog::replicas`]).
    fn heartbeat_with(
        &self,
        replica: &ReplicaId,
        info: ReplicaInfo,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// The committed state of a session (version and payload, read
    /// together atomically), `None` if it has none. For inspection and load
    /// test verification; turns get their state from `begin`.
    fn read_state(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = StoreResult<Option<crate::model::CommittedState>>> + Send;

    /// The live view of one session, `None` if it has no state.
    fn session(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = StoreResult<Option<SessionView>>> + Send;

    /// The data layout the stores hold, recording `mine` first if they
    /// hold none. With `adopt`, `mine` replaces another recorded layout
    /// once no live replica says it writes anything but `mine` (a replica
    /// that says nothing counts as another). Stores one build alone uses
    /// (the embedded one) hold no record and answer `mine`.
    fn claim_layout(
        &self,
        mine: u32,
        adopt: bool,
    ) -> impl Future<Output = StoreResult<u32>> + Send {
        let _ = adopt;
        std::future::ready(Ok(mine))
    }

    /// When (Unix ms) this process made the oldest commit the ledger may
    /// not have yet; `None` when everything it committed has shipped, or
    /// when commits reach the ledger at once (no shipping). A replica
    /// reports it with its heartbeat: shipping falling behind shows there.
    fn oldest_unshipped_ms(&self) -> Option<u64> {
        None
    }
}

/// What the scheduled workspace collector needs of the session store
/// (`workspace::WorkspaceStore::collect`).
pub trait WorkspaceRoots: Send + Sync {
    /// Takes or keeps the collector lease for `holder` for `ttl`: one
    /// replica collects at a time. False while another holds it.
    fn collector_lease(
        &self,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// Every workspace manifest a session may still use: those of the
    /// current states and of the ledger's durable copies.
    fn live_workspaces(
        &self,
    ) -> impl Future<Output = StoreResult<std::collections::HashSet<String>>> + Send;
}

/// The ledger's retention (`spec.ledger.retention`): turn records older
/// than it go. The sessions' counters and durable states stay.
pub trait LedgerRetention: Send + Sync {
    /// Deletes up to `limit` turn records committed before `before_ms`
    /// (Unix ms); returns how many went.
    fn forget_turns_before(
        &self,
        before_ms: u64,
        limit: u32,
    ) -> impl Future<Output = StoreResult<u64>> + Send;
}

/// What the dashboard reads: sessions, their turn history, live replicas.
pub trait SessionCatalog: Send + Sync {
    /// Sessions in (tenant, session) order, one page at a time.
    fn list_sessions(
        &self,
        query: &ListQuery,
    ) -> impl Future<Output = StoreResult<SessionPage>> + Send;

    /// The most recent turns of a session, newest first.
    fn turns(
        &self,
        key: &SessionKey,
        limit: u32,
    ) -> impl Future<Output = StoreResult<Vec<TurnRecord>>> + Send;

    /// Replicas whose heartbeat is current.
    fn replicas(&self) -> impl Future<Output = StoreResult<Vec<ReplicaView>>> + Send;

    /// The live view of one session (version, fence, lease; no turns),
    /// `None` if it has no state.
    fn inspect(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = StoreResult<Option<SessionView>>> + Send;

    /// Its committed state (version, payload, workspace), `None` if none.
    fn inspect_state(
        &self,
        key: &SessionKey,
    ) -> impl Future<Output = StoreResult<Option<crate::model::CommittedState>>> + Send;
}

/// The page size to use for `limit`: at least 1, at most [`crate::model::MAX_PAGE`].
pub fn page_size(limit: u32) -> u32 {
    limit.clamp(1, crate::model::MAX_PAGE)
}

/// Largest session state payload.
pub const MAX_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;
/// Largest stored reply (kept for idempotent retries).
pub const MAX_REPLY_BYTES: usize = 1024 * 1024;
/// Longest workspace manifest reference.
pub const MAX_WORKSPACE_REF_BYTES: usize = 1024;

/// Checks a commit's sizes; every backend calls it before any store access.
pub fn check_commit(req: &CommitRequest) -> StoreResult<()> {
    let checks = [
        ("the state payload", req.payload.len(), MAX_PAYLOAD_BYTES),
        ("the reply", req.reply.len(), MAX_REPLY_BYTES),
        (
            "the workspace reference",
            req.workspace.as_ref().map_or(0, String::len),
            MAX_WORKSPACE_REF_BYTES,
        ),
        ("the input digest", req.input_digest.len(), 128),
    ];
    for (what, size, limit) in checks {
        if size > limit {
            return Err(StoreError::TooLarge { what, size, limit });
        }
    }
    Ok(())
}

/// Cuts a `limit + 1` fetch down to a page and its continuation key.
pub fn page(sessions: &mut Vec<SessionSummary>, limit: u32) -> SessionPage {
    let more = sessions.len() > limit as usize;
    sessions.truncate(limit as usize);
    SessionPage {
        next: if more {
            sessions.last().map(|s| s.key.clone())
        } else {
            None
        },
        sessions: std::mem::take(sessions),
    }
}

/// What a replica said of itself (JSON of [`ReplicaInfo`]); empty when it
/// said nothing, corrupt when it is not that.
pub fn replica_info(id: &str, stored: Option<&str>) -> StoreResult<ReplicaInfo> {
    match stored {
        None | Some("") => Ok(ReplicaInfo::default()),
        Some(text) => serde_json::from_str(text)
            .map_err(|e| StoreError::Corrupt(format!("replica {id}: heartbeat info: {e}"))),
    }
}
