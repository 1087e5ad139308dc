//! Every way a turn can end without committing, and the outcome each
//! answers.

use super::*;

/// Every way a turn can end without committing. Nothing was written for any
/// of them.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("session {session} is busy: {owner} holds its lease")]
    Busy {
        session: SessionKey,
        owner: String,
        retry_after: Duration,
    },
    #[error("the state moved to version {current_version} under this turn; nothing was written")]
    Conflict { current_version: u64 },
    #[error("this turn lost its lease (expired or taken over); nothing was written")]
    LeaseLost,
    #[error("turnSeq skips ahead: the next one is {next_turn_seq}")]
    Gap { next_turn_seq: u64 },
    #[error(
        "turnSeq is at or below the last committed one ({last_turn_seq}) and its result is no longer kept"
    )]
    Stale { last_turn_seq: u64 },
    #[error(
        "turnSeq {turn_seq} already committed with another input; a retry must send the same input, a new turn the next turnSeq"
    )]
    TurnSeqReused { turn_seq: u64 },
    #[error(
        "the coordination store lost this session's state (the ledger knows version {last_version} and has no copy)"
    )]
    StateLost { last_version: u64 },
    #[error("this replica is draining; retry on another")]
    Draining,
    #[error(
        "this replica writes data layout {layout} but the stores hold layout {store}; it serves no turn (retry on another)"
    )]
    LayoutMismatch { layout: u32, store: u32 },
    #[error(
        "the turn was aborted at the drain timeout; nothing was committed, but the agent may have run"
    )]
    AbortedByDrain,
    #[error(
        "the turn was interrupted (a newer turn on the session asked for it, or a stop); nothing was committed"
    )]
    Interrupted,
    #[error(
        "the store did not answer the commit of turnSeq {turn_seq}: it may or may not have committed; retry with turnSeq {turn_seq} to find out (DUPLICATE if it did)"
    )]
    CommitUnknown { turn_seq: u64 },
    #[error("{0}")]
    Agent(AgentCallError),
    #[error("the agent's new state is not usable: {0}")]
    BadAgentState(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("workspace store: {0}")]
    Workspace(#[from] WorkspaceError),
}

impl TurnError {
    /// The outcome name (docs/design.md, "Outcomes"), for bodies, logs and metrics.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Busy { .. } => Outcome::Busy,
            Self::Conflict { .. } => Outcome::Conflict,
            Self::LeaseLost => Outcome::LeaseLost,
            Self::Gap { .. } => Outcome::Gap,
            Self::Stale { .. } => Outcome::Stale,
            Self::TurnSeqReused { .. } => Outcome::TurnSeqReused,
            Self::StateLost { .. } => Outcome::StateLost,
            Self::Draining => Outcome::Draining,
            Self::LayoutMismatch { .. } => Outcome::LayoutMismatch,
            Self::AbortedByDrain => Outcome::Aborted,
            Self::Interrupted => Outcome::Interrupted,
            Self::CommitUnknown { .. } => Outcome::CommitUnknown,
            Self::Agent(AgentCallError::Timeout(_)) => Outcome::AgentTimeout,
            Self::Agent(AgentCallError::Unreachable(_)) => Outcome::AgentUnavailable,
            Self::Agent(_) | Self::BadAgentState(_) => Outcome::AgentFailed,
            // The agent left files the workspace refuses (too many, too big,
            // names that are not UTF-8): its output, not a store outage.
            Self::Workspace(WorkspaceError::Refused { .. }) => Outcome::AgentFailed,
            Self::Workspace(WorkspaceError::BadManifest(..) | WorkspaceError::Corrupt { .. })
            | Self::Store(StoreError::Corrupt(_)) => Outcome::Corrupt,
            Self::Workspace(WorkspaceError::Io(_)) => Outcome::WorkspaceIo,
            Self::Store(StoreError::TooLarge { .. }) => Outcome::TooLarge,
            Self::Store(StoreError::InvalidId(_)) => Outcome::BadRequest,
            Self::Store(_) | Self::Workspace(_) => Outcome::StoreUnavailable,
        }
    }

    /// A failure of the agent or the stores (worth a log line), not a
    /// refusal the protocol expects (busy, duplicate, draining, bad input).
    pub fn is_fault(&self) -> bool {
        matches!(
            self.outcome(),
            Outcome::AgentTimeout
                | Outcome::AgentUnavailable
                | Outcome::AgentFailed
                | Outcome::Corrupt
                | Outcome::WorkspaceIo
                | Outcome::StoreUnavailable
                | Outcome::StateLost
                | Outcome::CommitUnknown
        )
    }
}
