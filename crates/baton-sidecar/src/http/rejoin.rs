//! `GET /v1/sessions/{session}/turns/{turnSeq}/stream`: a turn's stream
//! from any replica, whichever one runs the turn. It replays what the
//! turn's stream holds (after `Last-Event-ID`, when the client sends one)
//! and follows the rest from the store ([`crate::recorder`] copies every
//! streamed turn there), by the rules of [`crate::follow`].

use std::convert::Infallible;
use std::time::Instant;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use baton_session::turn_stream::{EventId, MAX_READ, TurnStreamReader, parse_event_id};
use tokio::sync::mpsc;

use super::*;
use crate::follow::{CHECK_EVERY, Follower, GRACE, POLL, TurnState};
use crate::live::Event;

/// The header an SSE client resumes with.
const LAST_EVENT_ID: &str = "last-event-id";

/// A `{turnSeq}` path segment.
/// A `turnSeq` from the request (`place`: "path" or "query").
pub(super) fn parse_turn_seq(place: &str, turn_seq: &str) -> ApiResult<u64> {
    turn_seq
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{place} turnSeq: {turn_seq:?} is not a turn number (1, 2, ...)"
            ))
            .with("field", "turnSeq")
        })
}

pub(super) async fn get_turn_stream<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Path((session, turn_seq)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let key = api.key(&headers, &session)?;
    let turn_seq = parse_turn_seq("path", &turn_seq)?;
    let after = match headers.get(LAST_EVENT_ID) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| parse_event_id(v.trim()))
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "header Last-Event-ID: not an event id of this stream ({attempt}-{n}, as its events' ids)",
                    )
                    .with("field", "Last-Event-ID")
                })?,
        ),
    };
    let engine = api.engine.clone();
    let store = &engine.store;
    let first = store.read_events(&key, turn_seq, after, MAX_READ).await?;
    let mut follower = Follower::new(turn_seq, after);
    if first.is_empty() {
        if let Some(after) = after
            && ended_at(store, &key, turn_seq, after).await?
        {
            // The client saw the end and came back (a browser's
            // EventSource reconnects on its own): 204 tells it to stop.
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let view = store.session(&key).await?;
        let alive = live_replicas(store).await?;
        match follower.judge(view.as_ref(), |id| alive.iter().any(|a| a == id)) {
            // Its replica keeps its stream once someone wants it.
            TurnState::Running => {
                store.want_events(&key, turn_seq).await?;
            }
            TurnState::Committed { .. } => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    Outcome::NotFound,
                    format!(
                        "turn {turn_seq} of session {key} committed and its stream is gone (it did not stream, or its stream expired {}s after its last event): send it again with turnSeq {turn_seq} for its answer (DUPLICATE)",
                        baton_session::turn_stream::STREAM_TTL.as_secs()
                    ),
                )
                .with("turnSeq", turn_seq));
            }
            TurnState::Abandoned => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    Outcome::NotFound,
                    format!("no turn {turn_seq} of session {key} is running or streamed"),
                )
                .with("turnSeq", turn_seq));
            }
        }
    }
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        follow(&engine.store, &key, &mut follower, first, &tx).await;
    });
    let events = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Whether the event at `at` is the end of its stream.
async fn ended_at<S: TurnStreamReader>(
    store: &S,
    key: &SessionKey,
    turn_seq: u64,
    at: EventId,
) -> ApiResult<bool> {
    let (attempt, n) = at;
    if n == 0 {
        return Ok(false); // an attempt's first event is its `turn`
    }
    let read = store
        .read_events(key, turn_seq, Some((attempt, n - 1)), 1)
        .await?;
    Ok(read
        .first()
        .is_some_and(|e| e.position() == at && e.kind.ends()))
}

/// The ids of the replicas whose heartbeat is current.
async fn live_replicas<S: ApiStore>(store: &S) -> ApiResult<Vec<String>> {
    Ok(store.replicas().await?.into_iter().map(|r| r.id).collect())
}

/// Sends `first` and what follows it until the stream ends or the client
/// goes away.
async fn follow<S: ApiStore>(
    store: &S,
    key: &SessionKey,
    follower: &mut Follower,
    first: Vec<Event>,
    tx: &mpsc::Sender<SseEvent>,
) {
    let mut read = first;
    let mut checked = Instant::now();
    let mut over_since: Option<Instant> = None;
    loop {
        let full = read.len() >= MAX_READ;
        let fresh = !read.is_empty();
        for event in follower.take(read) {
            let sse = SseEvent::default()
                .event(event.kind.as_str())
                .id(event.id())
                .data(event.data);
            if tx.send(sse).await.is_err() {
                return; // the client went away
            }
        }
        if follower.ended() {
            return;
        }
        if fresh {
            over_since = None;
            checked = Instant::now();
        } else if checked.elapsed() >= CHECK_EVERY {
            checked = Instant::now();
            let state = match store.session(key).await {
                Ok(view) => match live_replicas(store).await {
                    Ok(alive) => follower.judge(view.as_ref(), |id| alive.iter().any(|a| a == id)),
                    Err(_) => TurnState::Running, // asked again at the next check
                },
                Err(_) => TurnState::Running,
            };
            if state == TurnState::Running {
                over_since = None;
                // Nothing new for a while from a turn that runs: its
                // replica may not keep its stream (a retry whose own
                // client is still with it); ask again. Errors are asked
                // again at the next check.
                let _ = store.want_events(key, follower.turn_seq()).await;
            } else if over_since.get_or_insert_with(Instant::now).elapsed() >= GRACE {
                follower.end();
                let _ = tx.send(made_up_end(follower, state)).await;
                return;
            }
        }
        if !full {
            tokio::time::sleep(POLL).await;
        }
        read = match store
            .read_events(key, follower.turn_seq(), follower.after(), MAX_READ)
            .await
        {
            Ok(read) => read,
            Err(e) => {
                let _ = tx.send(failed(ApiError::from(e))).await;
                return;
            }
        };
    }
}

/// The `failed` event of a refusal. It has no id: a client that resumes
/// resumes after the last event the turn itself wrote.
fn failed(e: ApiError) -> SseEvent {
    SseEvent::default()
        .event(crate::live::Kind::Failed.as_str())
        .data(e.body().to_string())
}

/// The event that ends a stream whose turn is over without its end in it.
fn made_up_end(follower: &Follower, state: TurnState) -> SseEvent {
    let turn_seq = follower.turn_seq();
    match state {
        TurnState::Committed { version } => SseEvent::default()
            .event(crate::live::Kind::Committed.as_str())
            .data(
                json!({
                    "status": Outcome::Ok.as_str(),
                    "turnSeq": turn_seq,
                    "stateVersion": version,
                    "reply": null,
                    "error": format!("turn {turn_seq} committed, but the replica that ran it stopped before its reply reached the stream: send the turn again with turnSeq {turn_seq} for its reply (DUPLICATE)"),
                })
                .to_string(),
            ),
        TurnState::Running | TurnState::Abandoned => failed(
            ApiError::new(
                StatusCode::CONFLICT,
                Outcome::LeaseLost,
                format!(
                    "the replica running turn {turn_seq} stopped before it committed (its heartbeat lapsed, or it lost its lease): nothing was committed; send the turn again with turnSeq {turn_seq}"
                ),
            )
            .with("turnSeq", turn_seq)
            .with("attempt", follower.attempt()),
        ),
    }
}
