//! A turn's stream, kept beside its session so that any replica can replay
//! and follow a turn another replica runs (a client whose connection broke
//! rejoins wherever the load balancer sends it).
//!
//! One stream per `(session, turnSeq)`. Its events are numbered `(attempt,
//! n)`: the attempt is the lease's fence (every attempt at the turn gets a
//! larger one), `n` the event's place in the attempt from 0. The numbers
//! only grow, so a store refuses an event at or below the last one it
//! holds: once a newer attempt has written, an older one (fenced out, or
//! paused past its lease) can add nothing. A reader that sees a newer
//! attempt's first event drops what the older one said: only one attempt's
//! words are ever committed, and the last event says which.
//!
//! What is streamed is provisional: the session's state is what committed.
//! A stream lives [`STREAM_TTL`] after its last event, long enough for a
//! client to come back; the committed answer outlives it in the idempotency
//! record.

use std::future::Future;
use std::time::Duration;

use crate::ids::SessionKey;
use crate::store::StoreResult;

/// How long a turn's stream is kept after its last event.
pub const STREAM_TTL: Duration = Duration::from_secs(600);

/// Most events one read returns.
pub const MAX_READ: usize = 1000;

/// What a client following a turn is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// An attempt's first event: the turn's `turnSeq`, attempt and replica.
    Turn,
    /// The next piece of the reply (provisional until `Committed`).
    Delta,
    /// Something the agent is doing, as it said it.
    Progress,
    /// The last event of a committed turn: the answer a JSON client gets.
    Committed,
    /// The last event of an attempt that did not commit: its outcome and
    /// why. Whatever the attempt streamed is not part of the session.
    Failed,
}

impl EventKind {
    /// The SSE event name, and the name a store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Turn => "turn",
            Self::Delta => "delta",
            Self::Progress => "progress",
            Self::Committed => "committed",
            Self::Failed => "failed",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "turn" => Self::Turn,
            "delta" => Self::Delta,
            "progress" => Self::Progress,
            "committed" => Self::Committed,
            "failed" => Self::Failed,
            _ => return None,
        })
    }

    /// Whether this event ends its attempt's stream.
    pub fn ends(self) -> bool {
        matches!(self, Self::Committed | Self::Failed)
    }
}

/// One event of a turn's stream; `data` is JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEvent {
    pub kind: EventKind,
    /// The attempt (lease fence) it belongs to; 0 for a duplicate's answer,
    /// which no attempt ran.
    pub attempt: u64,
    /// Its place in the attempt's events, from 0.
    pub n: u64,
    pub data: String,
}

/// Where in a stream an event stands: `(attempt, n)`, ordered.
pub type EventId = (u64, u64);

impl StreamEvent {
    pub fn position(&self) -> EventId {
        (self.attempt, self.n)
    }

    /// The SSE id a client resumes from: `{attempt}-{n}`.
    pub fn id(&self) -> String {
        format!("{}-{}", self.attempt, self.n)
    }
}

/// An SSE id as [`StreamEvent::id`] writes it.
pub fn parse_event_id(id: &str) -> Option<EventId> {
    let (attempt, n) = id.split_once('-')?;
    if attempt.starts_with('+') || n.starts_with('+') {
        return None;
    }
    Some((attempt.parse().ok()?, n.parse().ok()?))
}

/// Reading the turn streams of a backend: all a follower or a dashboard
/// needs.
pub trait TurnStreamReader: Send + Sync {
    /// Asks the replica running turn `turn_seq` of `key` to copy its events
    /// to the store: a turn's stream is kept only once someone wants it (a
    /// client rejoining from another replica, a dashboard watching, or its
    /// own client gone before the end), so a turn nobody follows costs the
    /// store nothing. The holder learns it at its next
    /// [`crate::TurnStore::check_lease`] ([`crate::LeaseCheck::Followed`]).
    /// `Ok(false)` when that turn does not hold the lease. The only write a
    /// reader makes: a mark on the running lease, gone with it.
    fn want_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
    ) -> impl Future<Output = StoreResult<bool>> + Send;

    /// The events of `(key, turn_seq)`'s stream after `after` (from the
    /// start when `None`), at most `limit` (capped at [`MAX_READ`]), oldest
    /// first; empty when there are none (yet, or any more).
    fn read_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        after: Option<EventId>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<StreamEvent>>> + Send;
}

/// The turn streams of a backend, as the replica that runs a turn writes
/// them.
pub trait TurnStreams: TurnStreamReader {
    /// Appends `events` (of one attempt, in order) to the stream of
    /// `(key, turn_seq)`. `Ok(false)`, and nothing appended, when the
    /// stream already holds an event at or past the first one: a newer
    /// attempt has written (this one is over), or the events were appended
    /// before. The ids are the fencing: no lease is checked, so a replica
    /// whose lease lapsed may still say how its attempt ended, until a
    /// newer attempt writes.
    fn append_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        events: &[StreamEvent],
    ) -> impl Future<Output = StoreResult<bool>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_round_trip_and_refuse_anything_else() {
        let event = StreamEvent {
            kind: EventKind::Delta,
            attempt: 1_796_661_046_287_226,
            n: 4,
            data: "{}".into(),
        };
        assert_eq!(parse_event_id(&event.id()), Some(event.position()));
        for bad in ["", "7", "-1", "a-1", "1-b", "1-2-3", "+1-2", "1-+2", " 1-2"] {
            assert_eq!(parse_event_id(bad), None, "{bad:?}");
        }
        for kind in [
            EventKind::Turn,
            EventKind::Delta,
            EventKind::Progress,
            EventKind::Committed,
            EventKind::Failed,
        ] {
            assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(EventKind::parse("message"), None);
    }
}
