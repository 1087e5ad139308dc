//! Copies a live turn ([`crate::live`]) into its session's turn stream
//! ([`baton_session::turn_stream`]), where a client that lost its
//! connection rejoins it from any replica, and the dashboard watches it.
//!
//! The copy runs beside the turn and never holds it up. Events go in
//! batches: while one append is out, those that arrive wait and go in the
//! next, so a fast token stream costs one store round trip per batch, not
//! one per token.
//!
//! Recorded: every turn a client follows as a stream, and every turn whose
//! agent streams (its first delta or progress starts the copy, from the
//! turn's first event). A turn that neither streams nor is streamed costs
//! the store nothing.

use std::time::Duration;

use baton_session::SessionKey;
use baton_session::turn_stream::{MAX_READ, TurnStreams};

use crate::live::{Event, Kind, LiveTurn};

/// Pause before an append that failed is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Appends that may fail in a row before the copy gives up: the turn goes
/// on, its followers on other replicas see it end as its replica's
/// failure (see [`crate::follow`]).
const MAX_FAILURES: u32 = 50;

/// Whether a turn is copied from its start, or once its agent streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Always,
    WhenStreamed,
}

/// Copies `live` (the turn of `key`) to `store` until it ends, the store
/// refuses it (a newer attempt wrote) or the store fails
/// [`MAX_FAILURES`] times in a row.
pub async fn record<S: TurnStreams>(store: &S, key: &SessionKey, live: &LiveTurn, when: Record) {
    let mut seen = 0;
    let mut stored = 0;
    let mut recording = when == Record::Always;
    let mut failures = 0;
    loop {
        // Wait for news only once everything seen is stored.
        if !recording || stored >= seen {
            let fresh = live.next_from(seen).await;
            if fresh.is_empty() {
                return; // ended, and all of it stored (or none wanted)
            }
            seen += fresh.len();
            recording = recording
                || fresh
                    .iter()
                    .any(|e| matches!(e.kind, Kind::Delta | Kind::Progress));
            if !recording {
                continue;
            }
        }
        let batch = live.events_from(stored);
        let Some(first) = batch.first() else {
            continue;
        };
        if first.attempt == 0 {
            // A duplicate's stored answer: no attempt ran, nothing to keep.
            return;
        }
        let turn_seq = live.turn_seq();
        match store.append_events(key, turn_seq, &batch).await {
            Ok(true) => {
                stored += batch.len();
                failures = 0;
            }
            Ok(false) => match already_stored(store, key, turn_seq, &batch).await {
                // An append that failed did reach the store.
                Some(n) if n > 0 => stored += n,
                _ => {
                    tracing::debug!(session = %key, turn_seq, "a newer attempt writes this turn's stream: copy stopped");
                    return;
                }
            },
            Err(e) => {
                failures += 1;
                if failures >= MAX_FAILURES {
                    tracing::warn!(session = %key, turn_seq, error = %e, "the turn's stream could not be stored; clients that rejoin it elsewhere will see it end as failed");
                    return;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
        seen = seen.max(stored);
    }
}

/// How many of `batch`'s events the store already holds (an append whose
/// answer was lost may have been made); `None` when it holds another
/// attempt's events after them.
async fn already_stored<S: TurnStreams>(
    store: &S,
    key: &SessionKey,
    turn_seq: u64,
    batch: &[Event],
) -> Option<usize> {
    let first = batch.first()?;
    // Right before `first`: the previous event of its attempt, or past
    // every event of the attempts before it.
    let before = match first.n {
        0 => (first.attempt - 1, i64::MAX as u64),
        n => (first.attempt, n - 1),
    };
    let held = store
        .read_events(key, turn_seq, Some(before), batch.len().min(MAX_READ))
        .await
        .ok()?;
    let n = held
        .iter()
        .zip(batch)
        .take_while(|(held, ours)| held.position() == ours.position())
        .count();
    (n == held.len()).then_some(n)
}
