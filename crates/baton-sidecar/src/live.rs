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
    inner: Mutex<Inner>,
    /// The number of events, for readers waiting for the next one.
    count: watch::Sender<usize>,
    /// Whether someone elsewhere wants the turn's events (see
    /// [`crate::recorder`]): once true, true for good.
    wanted: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Inner {
    events: Vec<Event>,
    /// The turn's `turnSeq`, known once it started.
    turn_seq: u64,
    /// Ended without starting (refused): there will be no event.
    closed: bool,
}

impl Default for LiveTurn {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            count: watch::Sender::new(0),
            wanted: watch::Sender::new(false),
        }
    }
}

impl LiveTurn {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the turn's attempt `attempt` (its lease's fence; 0 for a
    /// duplicate's stored answer) of `turn_seq`: its `Turn` event.
    pub fn start(&self, attempt: u64, turn_seq: u64, data: String) {
        let mut inner = self.lock();
        inner.turn_seq = turn_seq;
        self.append(
            inner,
            Event {
                kind: Kind::Turn,
                attempt,
                n: 0,
                data,
            },
        );
    }

    /// Appends an event of the attempt started last. Events before the
    /// start or after the end are dropped: there is no stream to add to.
    pub fn push(&self, kind: Kind, data: String) {
        let inner = self.lock();
        let Some(last) = inner.events.last() else {
            return;
        };
        let (attempt, n) = (last.attempt, last.n + 1);
        self.append(
            inner,
            Event {
                kind,
                attempt,
                n,
                data,
            },
        );
    }

    /// Ends a turn that never started (it was refused): its readers stop
    /// waiting.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        let len = inner.events.len();
        drop(inner);
        // Wakes the readers even though the count is unchanged.
        self.count.send_replace(len);
    }

    fn append(&self, mut inner: std::sync::MutexGuard<'_, Inner>, event: Event) {
        if inner.closed || inner.events.last().is_some_and(|e| e.kind.ends()) {
            return;
        }
        inner.events.push(event);
        let len = inner.events.len();
        drop(inner);
        self.count.send_replace(len);
    }

    /// Someone elsewhere wants the turn's events: a reader asked the store
    /// for them, or the client that followed the turn here went away
    /// before its end (and may come back on another replica).
    pub fn want(&self) {
        self.wanted
            .send_if_modified(|w| !std::mem::replace(w, true));
    }

    /// Waits until [`Self::want`] was called.
    pub async fn wanted(&self) {
        let mut wanted = self.wanted.subscribe();
        let _ = wanted.wait_for(|w| *w).await;
    }

    /// Waits until the turn streams (its first delta or progress); `false`
    /// when it ended without.
    pub async fn streamed(&self) -> bool {
        let mut count = self.count.subscribe();
        loop {
            {
                let inner = self.lock();
                if inner
                    .events
                    .iter()
                    .any(|e| matches!(e.kind, Kind::Delta | Kind::Progress))
                {
                    return true;
                }
                if inner.closed || inner.events.last().is_some_and(|e| e.kind.ends()) {
                    return false;
                }
            }
            if count.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Waits until the turn has ended (or was refused before it started).
    pub async fn ended(&self) {
        let mut count = self.count.subscribe();
        loop {
            {
                let inner = self.lock();
                if inner.closed || inner.events.last().is_some_and(|e| e.kind.ends()) {
                    return;
                }
            }
            if count.changed().await.is_err() {
                return;
            }
        }
    }

    /// Whether the turn has started (or already ended).
    pub fn has_started(&self) -> bool {
        *self.count.borrow() > 0
    }

    /// The turn's `turnSeq`; 0 before it started.
    pub fn turn_seq(&self) -> u64 {
        self.lock().turn_seq
    }

    /// Waits until the turn's first event is out.
    pub async fn started(&self) {
        let mut count = self.count.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = count.wait_for(|n| *n > 0).await;
    }

    /// The events from index `from` on, as they are now.
    pub fn events_from(&self, from: usize) -> Vec<Event> {
        self.lock().events.get(from..).unwrap_or_default().to_vec()
    }

    /// The events from index `from` on, waiting for at least one when there
    /// are none yet. Empty only when the stream had already ended at `from`.
    pub async fn next_from(&self, from: usize) -> Vec<Event> {
        let mut count = self.count.subscribe();
        loop {
            {
                let inner = self.lock();
                if inner.events.len() > from {
                    return inner.events[from..].to_vec();
                }
                if inner.closed || inner.events.last().is_some_and(|e| e.kind.ends()) {
                    return Vec::new();
                }
            }
            if count.changed().await.is_err() {
                return Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn events_are_numbered_within_their_attempt() {
        let live = LiveTurn::default();
        live.push(Kind::Delta, r#"{"text":"too early"}"#.into());
        live.start(7, 1, r#"{"turnSeq":1,"attempt":7}"#.into());
        live.push(Kind::Delta, r#"{"text":"a"}"#.into());
        live.push(Kind::Progress, r#"{"name":"tool"}"#.into());
        live.push(Kind::Committed, "{}".into());
        live.push(Kind::Delta, r#"{"text":"late"}"#.into());
        let events = live.events_from(0);
        let ids: Vec<String> = events.iter().map(Event::id).collect();
        assert_eq!(
            ids,
            ["7-0", "7-1", "7-2", "7-3"],
            "nothing before the start or after the end"
        );
        assert_eq!(live.turn_seq(), 1);
        assert_eq!(parse_event_id("7-2"), Some((7, 2)));
    }

    #[tokio::test]
    async fn a_reader_waits_for_the_next_event_and_stops_at_the_end() {
        let live = Arc::new(LiveTurn::default());
        live.start(3, 1, r#"{"attempt":3}"#.into());
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

    #[tokio::test]
    async fn a_turn_refused_before_it_started_releases_its_readers() {
        let live = Arc::new(LiveTurn::default());
        let reader = tokio::spawn({
            let live = live.clone();
            async move { live.next_from(0).await }
        });
        live.close();
        let got = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader stopped waiting")
            .unwrap();
        assert!(got.is_empty());
        live.start(1, 1, "{}".into());
        assert!(!live.has_started(), "nothing starts once closed");
    }
}
