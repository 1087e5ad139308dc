//! The running turn's output as the session page shows it: its turn
//! stream (the events the replica that runs it copies to the store, see
//! `baton_session::turn_stream`), read by the dashboard from the store and
//! folded into the words so far. Reading the store, not the replica, shows
//! the same on every dashboard and needs no call to a sidecar. A replica
//! keeps a turn's stream only once someone wants it: a page that finds none
//! for the running attempt asks for it (a mark on the lease, the only
//! write a page makes), and its words show from the next read on.

use baton_session::SessionKey;
use baton_session::turn_stream::{EventKind, MAX_READ, StreamEvent};
use baton_views::LeaseView;
use serde::Deserialize;

use crate::model::LiveOutput;
use crate::server::Dashboard;
use crate::server::error::PageError;

/// The most of a running reply the page shows: its end, past this.
pub const SHOWN_CHARS: usize = 16 * 1024;

/// Reads at most this many events of one turn per look (`MAX_READ` each):
/// a turn that streamed more shows its first ones' text cut.
const MOST_READS: usize = 8;

/// What the running turn of `key` (the lease `lease` holds) has streamed.
pub async fn read(
    dashboard: &Dashboard,
    key: &SessionKey,
    lease: &LeaseView,
) -> Result<LiveOutput, PageError> {
    let mut events = Vec::new();
    let mut after = None;
    for _ in 0..MOST_READS {
        let read = dashboard
            .catalog
            .turn_events(key, lease.turn_seq, after)
            .await?;
        let full = read.len() >= MAX_READ;
        after = read.last().map(StreamEvent::position).or(after);
        events.extend(read);
        if !full {
            break;
        }
    }
    let output = fold(lease, &events);
    if output.events == 0 {
        dashboard
            .catalog
            .want_turn_events(key, lease.turn_seq)
            .await?;
    }
    Ok(output)
}

#[derive(Deserialize)]
struct Delta {
    text: String,
}

#[derive(Deserialize)]
struct Progress {
    name: String,
}

/// The words of the lease's attempt (events of other attempts are older
/// ones', voided: only the running attempt can commit).
pub fn fold(lease: &LeaseView, events: &[StreamEvent]) -> LiveOutput {
    let mut voided: Vec<u64> = events
        .iter()
        .map(|e| e.attempt)
        .filter(|a| *a != lease.fence && *a != 0)
        .collect();
    voided.dedup();
    let mut text = String::new();
    let mut doing = None;
    let mut count = 0;
    for event in events.iter().filter(|e| e.attempt == lease.fence) {
        count += 1;
        match event.kind {
            EventKind::Delta => {
                if let Ok(delta) = serde_json::from_str::<Delta>(&event.data) {
                    text.push_str(&delta.text);
                }
            }
            EventKind::Progress => {
                doing = serde_json::from_str::<Progress>(&event.data)
                    .ok()
                    .map(|p| p.name.chars().take(120).collect());
            }
            EventKind::Turn | EventKind::Committed | EventKind::Failed => {}
        }
    }
    let total = text.chars().count();
    let cut = total > SHOWN_CHARS;
    if cut {
        text = text.chars().skip(total - SHOWN_CHARS).collect();
    }
    LiveOutput {
        turn_seq: lease.turn_seq,
        attempt: lease.fence,
        owner: lease.owner.clone(),
        text,
        cut,
        doing,
        events: count,
        voided_attempts: voided.len() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, attempt: u64, n: u64, data: &str) -> StreamEvent {
        StreamEvent {
            kind,
            attempt,
            n,
            data: data.into(),
        }
    }

    fn lease(fence: u64) -> LeaseView {
        LeaseView {
            owner: "replica-1-abc".into(),
            fence,
            turn_seq: 4,
            expires_at_ms: 0,
        }
    }

    #[test]
    fn only_the_running_attempts_words_show() {
        use EventKind::*;
        let events = [
            event(Turn, 7, 0, "{}"),
            event(Delta, 7, 1, r#"{"text":"dead "}"#),
            event(Turn, 9, 0, "{}"),
            event(Progress, 9, 1, r#"{"name":"searching"}"#),
            event(Delta, 9, 2, r#"{"text":"Hello, "}"#),
            event(Delta, 9, 3, r#"{"text":"<b>world</b>"}"#),
            event(Delta, 9, 4, "not json"),
        ];
        let out = fold(&lease(9), &events);
        assert_eq!(out.text, "Hello, <b>world</b>");
        assert_eq!(out.doing.as_deref(), Some("searching"));
        assert_eq!((out.turn_seq, out.attempt, out.events), (4, 9, 5));
        assert_eq!(out.voided_attempts, 1);
        assert!(!out.cut);

        let nothing = fold(&lease(11), &events);
        assert_eq!((nothing.text.as_str(), nothing.events), ("", 0));
        assert_eq!(nothing.voided_attempts, 2);
    }

    #[test]
    fn a_long_reply_shows_its_end() {
        let word = format!(r#"{{"text":"{}"}}"#, "é".repeat(1000));
        let events: Vec<StreamEvent> = (0..20)
            .map(|n| event(EventKind::Delta, 3, n, &word))
            .collect();
        let out = fold(&lease(3), &events);
        assert!(out.cut);
        assert_eq!(out.text.chars().count(), SHOWN_CHARS);
    }
}
