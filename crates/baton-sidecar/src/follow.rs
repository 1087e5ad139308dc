//! Following a turn from its stored stream (`GET
//! /v1/sessions/{session}/turns/{turnSeq}/stream`), wherever it runs: what
//! to send of what was read, and when a turn whose replica went quiet is
//! over. Pure: the HTTP handler reads the store and the clock.
//!
//! The rules a client relies on:
//! - Events come in order, each once: a client that resumes with the id of
//!   the last one it saw (`Last-Event-ID`) gets the ones after it.
//! - A `turn` event starts an attempt: what an earlier attempt said is void.
//!   Of what a read returns, an older attempt's events are not sent at all
//!   when a newer attempt's `turn` follows them.
//! - The stream ends with the first `committed` or `failed` event sent. A
//!   turn nobody runs any more without its end in the stream (its replica
//!   was killed, paused past its heartbeat, or lost the store) ends with a
//!   `failed` event the follower makes up, once [`GRACE`] has shown that
//!   the end is not merely on its way.

use std::time::Duration;

use baton_session::SessionView;
use baton_session::turn_stream::EventId;

use crate::live::Event;

/// Pause between reads of a stream that had nothing new.
pub const POLL: Duration = Duration::from_millis(50);
/// How often a quiet stream's turn is checked for a replica still running it.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long a turn must look over (committed, or run by nobody) before the
/// follower ends the stream itself: a commit releases the lease a moment
/// before its `committed` event is stored.
pub const GRACE: Duration = Duration::from_secs(1);

/// Where a turn stands, as the session's live view tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnState {
    /// A live replica holds the session's lease for this turn.
    Running,
    /// The session's last committed turn is this one or a later one, at
    /// `version` when it is this one.
    Committed { version: Option<u64> },
    /// Not committed and nobody runs it: its replica stopped, or the
    /// session expired.
    Abandoned,
}

/// One client's place in one turn's stream.
#[derive(Debug)]
pub struct Follower {
    turn_seq: u64,
    after: Option<EventId>,
    ended: bool,
}

impl Follower {
    /// A follower of turn `turn_seq` that has seen the events up to
    /// `after` (none when `None`).
    pub fn new(turn_seq: u64, after: Option<EventId>) -> Self {
        Self {
            turn_seq,
            after,
            ended: false,
        }
    }

    /// Where the next read starts (after this event).
    pub fn after(&self) -> Option<EventId> {
        self.after
    }

    /// Whether the stream has sent its last event.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Of `read`, the events read after [`Self::after`], those to send.
    pub fn take(&mut self, read: Vec<Event>) -> Vec<Event> {
        if self.ended {
            return Vec::new();
        }
        // From the newest attempt's start on, when the read holds one.
        let from = read
            .iter()
            .rposition(|e| e.n == 0 && e.kind == crate::live::Kind::Turn)
            .unwrap_or(0);
        let mut send: Vec<Event> = read.into_iter().skip(from).collect();
        if let Some(end) = send.iter().position(|e| e.kind.ends()) {
            send.truncate(end + 1);
            self.ended = true;
        }
        if let Some(last) = send.last() {
            self.after = Some(last.position());
        }
        send
    }

    /// Where the turn stands, from the session's view (`None`: no state)
    /// and whether a replica id's heartbeat is current.
    pub fn judge(&self, view: Option<&SessionView>, alive: impl Fn(&str) -> bool) -> TurnState {
        let Some(view) = view else {
            return TurnState::Abandoned;
        };
        if view.last_turn_seq >= self.turn_seq {
            return TurnState::Committed {
                version: (view.last_turn_seq == self.turn_seq).then_some(view.version),
            };
        }
        match &view.lease {
            Some(lease) if lease.turn_seq == self.turn_seq && alive(&lease.owner) => {
                TurnState::Running
            }
            _ => TurnState::Abandoned,
        }
    }

    /// Marks the stream ended by an event the follower made up.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// The attempt the follower last saw, if any.
    pub fn attempt(&self) -> Option<u64> {
        self.after.map(|(attempt, _)| attempt)
    }

    pub fn turn_seq(&self) -> u64 {
        self.turn_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::Kind;
    use baton_session::{LeaseView, SessionKey};

    fn ev(kind: Kind, attempt: u64, n: u64) -> Event {
        Event {
            kind,
            attempt,
            n,
            data: "{}".into(),
        }
    }

    fn ids(events: &[Event]) -> Vec<EventId> {
        events.iter().map(Event::position).collect()
    }

    #[test]
    fn a_newer_attempt_voids_what_an_older_one_said_in_the_same_read() {
        let mut f = Follower::new(1, None);
        let sent = f.take(vec![
            ev(Kind::Turn, 5, 0),
            ev(Kind::Delta, 5, 1),
            ev(Kind::Turn, 9, 0),
            ev(Kind::Delta, 9, 1),
        ]);
        assert_eq!(ids(&sent), [(9, 0), (9, 1)]);
        assert_eq!(f.after(), Some((9, 1)));
        assert!(!f.ended());
        // In a later read, the newer attempt's start is sent as it comes.
        let mut f = Follower::new(1, None);
        f.take(vec![ev(Kind::Turn, 5, 0), ev(Kind::Delta, 5, 1)]);
        let sent = f.take(vec![ev(Kind::Turn, 9, 0)]);
        assert_eq!(ids(&sent), [(9, 0)]);
    }

    #[test]
    fn the_first_end_ends_the_stream() {
        let mut f = Follower::new(1, Some((5, 1)));
        let sent = f.take(vec![
            ev(Kind::Delta, 5, 2),
            ev(Kind::Committed, 5, 3),
            ev(Kind::Delta, 5, 4),
        ]);
        assert_eq!(ids(&sent), [(5, 2), (5, 3)]);
        assert!(f.ended());
        assert!(f.take(vec![ev(Kind::Delta, 5, 5)]).is_empty());
        // An attempt that failed, followed by the retry: the retry's
        // events, not the failure, when both are in the read.
        let mut f = Follower::new(1, None);
        let sent = f.take(vec![
            ev(Kind::Turn, 5, 0),
            ev(Kind::Failed, 5, 1),
            ev(Kind::Turn, 6, 0),
        ]);
        assert_eq!(ids(&sent), [(6, 0)]);
        assert!(!f.ended());
    }

    fn view(last_turn_seq: u64, lease: Option<(&str, u64)>) -> SessionView {
        SessionView {
            key: SessionKey::new("t", "s").unwrap(),
            version: 7,
            fence: 3,
            last_turn_seq,
            last_replica: None,
            updated_at_ms: 0,
            workspace: None,
            lease: lease.map(|(owner, turn_seq)| LeaseView {
                owner: owner.into(),
                fence: 3,
                turn_seq,
                expires_at_ms: u64::MAX,
            }),
        }
    }

    #[test]
    fn a_turn_runs_while_a_live_replica_holds_its_lease() {
        let f = Follower::new(4, None);
        let alive = |id: &str| id == "a-1";
        assert_eq!(
            f.judge(Some(&view(3, Some(("a-1", 4)))), alive),
            TurnState::Running
        );
        assert_eq!(
            f.judge(Some(&view(3, Some(("b-1", 4)))), alive),
            TurnState::Abandoned,
            "its holder's heartbeat lapsed"
        );
        assert_eq!(
            f.judge(Some(&view(3, Some(("a-1", 5)))), alive),
            TurnState::Abandoned,
            "the lease runs another turn"
        );
        assert_eq!(f.judge(Some(&view(3, None)), alive), TurnState::Abandoned);
        assert_eq!(f.judge(None, alive), TurnState::Abandoned);
        assert_eq!(
            f.judge(Some(&view(4, None)), alive),
            TurnState::Committed { version: Some(7) }
        );
        assert_eq!(
            f.judge(Some(&view(6, Some(("a-1", 7)))), alive),
            TurnState::Committed { version: None }
        );
    }
}
