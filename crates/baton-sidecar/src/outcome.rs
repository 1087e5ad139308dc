//! Every outcome the turn API answers, by name: the `status` of a body,
//! the `x-baton-outcome` header, the metrics' label. One list, so the
//! README's table can be checked against it (tests/tests/docs.rs).

/// Declares the enum, its names and `ALL` from one list, so no outcome can
/// be in one and missing from another.
macro_rules! outcomes {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// An answer's outcome. `as_str` is the name on the wire.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Outcome {
            $($(#[$doc])* $variant,)*
        }

        impl Outcome {
            /// Every outcome, in the README table's order.
            pub const ALL: &[Outcome] = &[$(Self::$variant,)*];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }
        }
    };
}

outcomes! {
    Ok => "OK",
    Duplicate => "DUPLICATE",
    Busy => "BUSY",
    Conflict => "CONFLICT",
    LeaseLost => "LEASE_LOST",
    Gap => "GAP",
    Stale => "STALE",
    TurnSeqReused => "TURN_SEQ_REUSED",
    BadRequest => "BAD_REQUEST",
    Invalid => "INVALID",
    TooLarge => "TOO_LARGE",
    /// A body that does not say it is JSON (`Content-Type:
    /// application/json`): a browser sends form and text bodies to another
    /// site without asking first, so they may not run a turn.
    UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
    /// A request body that did not all arrive within 30 s of its headers.
    RequestTimeout => "REQUEST_TIMEOUT",
    Unauthorized => "UNAUTHORIZED",
    Forbidden => "FORBIDDEN",
    NotFound => "NOT_FOUND",
    MethodNotAllowed => "METHOD_NOT_ALLOWED",
    Draining => "DRAINING",
    LayoutMismatch => "LAYOUT_MISMATCH",
    Aborted => "ABORTED",
    /// Interrupted by a newer turn (`?onBusy=interrupt`) or a stop:
    /// nothing was committed.
    Interrupted => "INTERRUPTED",
    CommitUnknown => "COMMIT_UNKNOWN",
    StateLost => "STATE_LOST",
    StoreUnavailable => "STORE_UNAVAILABLE",
    Corrupt => "CORRUPT",
    WorkspaceIo => "WORKSPACE_IO",
    NotDrained => "NOT_DRAINED",
    Internal => "INTERNAL",
    AgentUnavailable => "AGENT_UNAVAILABLE",
    AgentFailed => "AGENT_FAILED",
    AgentTimeout => "AGENT_TIMEOUT",
    /// `baton dev`'s front door: the replica died during the turn.
    ReplicaFailed => "REPLICA_FAILED",
    /// `baton dev`'s front door: no replica is ready.
    NoReplica => "NO_REPLICA",
    /// `baton dev rollout`: another rollout runs.
    RolloutRunning => "ROLLOUT_RUNNING",
    /// `baton dev rollout`: a replica did not come back.
    RolloutFailed => "ROLLOUT_FAILED",
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_own_name() {
        let names: std::collections::BTreeSet<&str> =
            Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(names.len(), Outcome::ALL.len());
    }
}
