//! A running turn as its clients follow it: which attempt runs it, what the
//! agent streamed so far, and how it ended. The turn appends; any number of
//! readers follow from where they are, each at its own pace, without the
//! turn ever waiting for them.
//!
//! Events carry ids `{attempt}-{n}` (see [`baton_session::turn_stream`]),
//! so a client that lost its connection resumes with `Last-Event-ID` and
//! sees no event twice.

use std::sync::Mutex;

use tokio::sync::watch;

pub use baton_session::turn_stream::{EventKind as Kind, StreamEvent as Event, parse_event_id};

/// The events of one turn on this replica, as they happen.
#[derive(Debug)]
pub struct LiveTurn {
    events: Mutex<Vec<Event>>,
    /// The number of events, for readers waiting for the next one.
    count: watch::Sender<usize>,
}

impl Default for LiveTurn {
    fn default() -> Self {
        Self {
            events: Mutex::new(Vec::new()),
            count: watch::Sender::new(0),
        }
    }
}

impl LiveTurn {
    /// Appends an event of the current attempt (the one the last `Turn`
    /// event started). Events after the end are dropped: the stream is over.
    pub fn push(&self, kind: Kind, data: String) {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.last().is_some_and(|e| e.kind.ends()) {
            return;
        }
        let (attempt, n) = match (kind, events.last()) {
            (Kind::Turn, _) | (_, None) => (attempt_of(&data), 0),
            (_, Some(last)) => (last.attempt, last.n + 1),
        };
        events.push(Event {
            kind,
            attempt,
            n,
            data,
        });
        let len = events.len();
        drop(events);
        self.count.send_replace(len);
    }

    /// Whether the turn has started (or already ended).
    pub fn has_started(&self) -> bool {
        *self.count.borrow() > 0
    }

    /// Waits until the turn's first event is out.
    pub async fn started(&self) {
        let mut count = self.count.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = count.wait_for(|n| *n > 0).await;
    }

    /// The events from index `from` on, waiting for at least one when there
    /// are none yet. Empty only when the stream had already ended at `from`.
    pub async fn next_from(&self, from: usize) -> Vec<Event> {
        let mut count = self.count.subscribe();
        loop {
            {
                let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
                if events.len() > from {
                    return events[from..].to_vec();
                }
                if events.last().is_some_and(|e| e.kind.ends()) {
                    return Vec::new();
                }
            }
            if count.changed().await.is_err() {
                return Vec::new();
            }
        }
    }
}

/// The attempt a `Turn` event's data names (`"attempt": N`); 0 when none
/// does (a duplicate's answer).
fn attempt_of(data: &str) -> u64 {
    #[derive(serde::Deserialize)]
    struct Attempt {
        #[serde(default)]
        attempt: Option<u64>,
    }
    serde_json::from_str::<Attempt>(data)
        .ok()
        .and_then(|a| a.attempt)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn events_are_numbered_within_their_attempt() {
        let live = LiveTurn::default();
        live.push(Kind::Turn, r#"{"turnSeq":1,"attempt":7}"#.into());
        live.push(Kind::Delta, r#"{"text":"a"}"#.into());
        live.push(Kind::Progress, r#"{"name":"tool"}"#.into());
        live.push(Kind::Committed, "{}".into());
        live.push(Kind::Delta, r#"{"text":"late"}"#.into());
        let events = live.events.lock().unwrap().clone();
        let ids: Vec<String> = events.iter().map(Event::id).collect();
        assert_eq!(ids, ["7-0", "7-1", "7-2", "7-3"], "nothing after the end");
        assert_eq!(parse_event_id("7-2"), Some((7, 2)));
    }

    #[tokio::test]
    async fn a_reader_waits_for_the_next_event_and_stops_at_the_end() {
        let live = Arc::new(LiveTurn::default());
        live.push(Kind::Turn, r#"{"attempt":3}"#.into());
        assert_eq!(live.next_from(0).await.len(), 1);
        let reader = tokio::spawn({
            let live = live.clone();
            async move { live.next_from(1).await }
        });
        live.push(Kind::Delta, r#"{"text":"x"}"#.into());
        let got = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader woke")
            .unwrap();
        assert_eq!(got[0].kind, Kind::Delta);
        live.push(Kind::Failed, "{}".into());
        assert_eq!(live.next_from(3).await, Vec::new(), "ended: nothing more");
    }
}
