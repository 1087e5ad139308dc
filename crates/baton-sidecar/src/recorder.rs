//! Copies a live turn ([`crate::live`]) into its session's turn stream
//! ([`baton_session::turn_stream`]), where a client that lost its
//! connection rejoins it from any replica, and the dashboard watches it.
//!
//! The copy runs beside the turn and never holds it up. Events go in
//! batches, at most one append every [`BATCH_EVERY`] (and while one append
//! is out, those that arrive wait for the next), so a fast token stream
//! costs the store ten round trips a second, not one per token.
//!
//! A turn is copied only once someone wants it ([`LiveTurn::want`]): the
//! client that followed it here went away before its end (it may come back
//! on another replica), or a reader elsewhere asked the store for it (a
//! client rejoining, a dashboard watching: the turn learns it at its next
//! lease check, within [`crate::engine::LEASE_CHECK`]). The copy then
//! starts from the turn's first event. A turn nobody follows costs the
//! store nothing: it would cost Redis one stream entry per token.

use std::time::Duration;

use baton_session::SessionKey;
use baton_session::turn_stream::{MAX_READ, TurnStreams};

use crate::live::{Event, LiveTurn};

/// Pause before an append that failed is tried again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Appends that may fail in a row before the copy gives up: the turn goes
/// on, its followers on other replicas see it end as its replica's
/// failure (see [`crate::follow`]).
const MAX_FAILURES: u32 = 50;

/// Shortest time between two appends of one turn: a model writing a token
/// every 10 ms costs the store ten appends a second, not a hundred. A
/// follower sees the words this much later, at most.
const BATCH_EVERY: Duration = Duration::from_millis(100);

/// How long after its end a turn can still be wanted: its client's
/// connection may break just as the last event goes out.
const WANTED_AFTER_END: Duration = Duration::from_secs(1);

/// Copies `live` (the turn of `key`) to `store` until it ends, the store
/// refuses it (a newer attempt wrote) or the store fails
/// [`MAX_FAILURES`] times in a row.
pub async fn record<S: TurnStreams>(store: &S, key: &SessionKey, live: &LiveTurn) {
    let kept_before = async {
        if live.streamed().await && continues_a_kept_stream(store, key, live).await {
            return;
        }
        std::future::pending::<()>().await;
    };
    let unwanted = async {
        live.ended().await;
        tokio::time::sleep(WANTED_AFTER_END).await;
    };
    tokio::select! {
        () = live.wanted() => {}
        () = kept_before => {}
        () = unwanted => return,
    }
    let mut seen = 0;
    let mut stored = 0;
    let mut failures = 0;
    let mut appended_at: Option<tokio::time::Instant> = None;
    loop {
        // Wait for news only once everything seen is stored.
        if stored >= seen {
            let fresh = live.next_from(seen).await;
            if fresh.is_empty() {
                return; // ended, and all of it stored
            }
            seen += fresh.len();
        }
        // At most one append per BATCH_EVERY while the turn runs: what
        // comes meanwhile joins the batch (its end goes at once).
        if let Some(at) = appended_at {
            tokio::select! {
                () = tokio::time::sleep_until(at + BATCH_EVERY) => {}
                () = live.ended() => {}
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
        appended_at = Some(tokio::time::Instant::now());
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

/// Whether `live` is a retry of a turn whose earlier attempt's stream was
/// kept (its followers saw that attempt die): then this attempt's words
/// must follow in the stream as they come, or a client replaying the turn
/// would be shown the dead attempt's. One read, made once a turn streams
/// (its first delta or progress): a turn whose agent answers at once pays
/// nothing.
async fn continues_a_kept_stream<S: TurnStreams>(
    store: &S,
    key: &SessionKey,
    live: &LiveTurn,
) -> bool {
    let events = live.events_from(0);
    let Some(first) = events.first() else {
        return false;
    };
    if first.attempt == 0 {
        return false;
    }
    store
        .read_events(key, live.turn_seq(), None, 1)
        .await
        .is_ok_and(|kept| kept.first().is_some_and(|e| e.attempt < first.attempt))
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
