//! The turn protocol's decisions as pure functions: what `begin` and
//! `commit` answer given what the store holds. The SQLite backend calls
//! them inside its transactions; `redis/begin.lua` and `redis/commit.lua`
//! are the same rules in Lua (Redis runs no Rust), and the contract suite
//! holds the two to the same answers.

use std::time::Duration;

/// Idempotency records kept per session: a retry of one of the last this
/// many turns gets its stored result; an older one gets STALE. Every
/// backend keeps as many.
pub const RESULTS_RETAINED: u64 = 1024;

/// What the store holds of a session when a turn begins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub version: u64,
    pub fence: u64,
    pub last_turn_seq: u64,
}

/// A lease that still counts: unexpired, and its owner still heartbeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveLease {
    pub owner: String,
    pub expires_in: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BeginDecision {
    /// The turnSeq already committed: answer with its stored result if it
    /// is still retained (DUPLICATE), else STALE.
    Replay {
        turn_seq: u64,
    },
    Busy {
        owner: String,
        retry_after: Duration,
    },
    Gap {
        next_turn_seq: u64,
    },
    Grant {
        turn_seq: u64,
        fence: u64,
    },
}

/// The next fence: one more than the last, and never behind the clock (in
/// microseconds), so fences stay monotonic even across a lost store that is
/// restored from the ledger.
pub fn next_fence(last: u64, now_us: u64) -> u64 {
    last.saturating_add(1).max(now_us)
}

/// Begin's rules, in order: a replayed turnSeq is answered from the
/// idempotency records even while another turn runs; a live lease makes the
/// caller wait; a turnSeq may not skip ahead; otherwise the lease is granted
/// under a new fence, for the requested turnSeq or the next one.
pub fn decide_begin(
    counters: Counters,
    live_lease: Option<LiveLease>,
    requested_turn_seq: Option<u64>,
    now_us: u64,
) -> BeginDecision {
    let last = counters.last_turn_seq;
    if let Some(seq) = requested_turn_seq.filter(|seq| *seq <= last) {
        return BeginDecision::Replay { turn_seq: seq };
    }
    if let Some(lease) = live_lease {
        return BeginDecision::Busy {
            owner: lease.owner,
            retry_after: lease.expires_in,
        };
    }
    let turn_seq = requested_turn_seq.unwrap_or(last + 1);
    if turn_seq > last + 1 {
        return BeginDecision::Gap {
            next_turn_seq: last + 1,
        };
    }
    BeginDecision::Grant {
        turn_seq,
        fence: next_fence(counters.fence, now_us),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitDecision {
    Write { new_version: u64 },
    LeaseLost,
    Conflict { current_version: u64 },
}

/// Commit's rules: the lease must still carry the caller's fence (else it
/// expired or was taken over), then the state must still be at the version
/// the turn started from. Either failure writes nothing.
pub fn decide_commit(
    held_fence: Option<u64>,
    fence: u64,
    current_version: u64,
    expected_version: u64,
) -> CommitDecision {
    if held_fence != Some(fence) {
        return CommitDecision::LeaseLost;
    }
    if current_version != expected_version {
        return CommitDecision::Conflict { current_version };
    }
    CommitDecision::Write {
        new_version: current_version + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    fn at(version: u64, last_turn_seq: u64) -> Counters {
        Counters {
            version,
            fence: 5,
            last_turn_seq,
        }
    }

    fn busy() -> Option<LiveLease> {
        Some(LiveLease {
            owner: "r2".into(),
            expires_in: Duration::from_secs(3),
        })
    }

    #[test]
    fn a_new_session_grants_turn_one() {
        assert_eq!(
            decide_begin(Counters::default(), None, None, NOW),
            BeginDecision::Grant {
                turn_seq: 1,
                fence: NOW
            }
        );
    }

    #[test]
    fn without_a_turn_seq_the_next_one_is_assigned() {
        assert!(matches!(
            decide_begin(at(4, 4), None, None, 0),
            BeginDecision::Grant { turn_seq: 5, .. }
        ));
    }

    #[test]
    fn a_replayed_turn_seq_is_answered_even_while_busy() {
        for seq in [1, 4] {
            assert_eq!(
                decide_begin(at(4, 4), busy(), Some(seq), NOW),
                BeginDecision::Replay { turn_seq: seq }
            );
        }
    }

    #[test]
    fn a_live_lease_makes_others_wait() {
        let decision = decide_begin(at(4, 4), busy(), Some(5), NOW);
        assert_eq!(
            decision,
            BeginDecision::Busy {
                owner: "r2".into(),
                retry_after: Duration::from_secs(3)
            }
        );
        assert!(matches!(
            decide_begin(at(4, 4), busy(), None, NOW),
            BeginDecision::Busy { .. }
        ));
    }

    #[test]
    fn a_turn_seq_may_not_skip_ahead() {
        assert_eq!(
            decide_begin(at(4, 4), None, Some(6), NOW),
            BeginDecision::Gap { next_turn_seq: 5 }
        );
        assert!(matches!(
            decide_begin(at(4, 4), None, Some(5), NOW),
            BeginDecision::Grant { turn_seq: 5, .. }
        ));
    }

    #[test]
    fn fences_grow_by_one_or_jump_to_the_clock() {
        assert_eq!(next_fence(5, 3), 6);
        assert_eq!(next_fence(5, 1_000), 1_000);
        assert_eq!(next_fence(u64::MAX, 0), u64::MAX);
    }

    #[test]
    fn commit_needs_the_fence_then_the_version() {
        assert_eq!(
            decide_commit(Some(9), 9, 3, 3),
            CommitDecision::Write { new_version: 4 }
        );
        assert_eq!(decide_commit(None, 9, 3, 3), CommitDecision::LeaseLost);
        assert_eq!(decide_commit(Some(10), 9, 3, 3), CommitDecision::LeaseLost);
        assert_eq!(
            decide_commit(Some(9), 9, 4, 3),
            CommitDecision::Conflict { current_version: 4 }
        );
        // A fenced-out writer learns LEASE_LOST, not CONFLICT, even if the version moved.
        assert_eq!(decide_commit(Some(10), 9, 4, 3), CommitDecision::LeaseLost);
    }
}
