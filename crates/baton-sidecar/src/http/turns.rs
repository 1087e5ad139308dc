//! Running turns: `POST /v1/sessions/{session}/turns` and the article's
//! `POST /api/chat`. A client that sends `Accept: text/event-stream` gets
//! the turn as Server-Sent Events (see [`crate::live`]): `turn` (its
//! `turnSeq`, attempt and replica), the agent's `delta` and `progress`
//! events as they arrive, and `committed` (the JSON answer) or `failed`
//! (the refusal's body: nothing streamed before it was committed). Any
//! other client gets the JSON answer, also from a streaming agent.

use std::convert::Infallible;

use axum::response::sse::{KeepAlive, Sse};
use futures::StreamExt;

use tokio::task::{JoinError, JoinHandle};

use super::*;
use crate::live::{Kind, LiveTurn};
use crate::outcome::Outcome;
use crate::recorder;

/// The body of `POST /v1/sessions/{session}/turns`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnBody {
    pub input: String,
    #[serde(default)]
    pub turn_seq: Option<u64>,
}

/// The body of the article's `POST /api/chat`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChatBody {
    pub session_id: String,
    pub input: String,
    #[serde(default)]
    pub turn_seq: Option<u64>,
}

/// A turn's query: what to do when another turn holds the session.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnQuery {
    /// `reject` (BUSY at once, the default), `wait` (for `wait`, or
    /// [`DEFAULT_WAIT`]) or `interrupt` (stop the running turn, then run).
    on_busy: Option<String>,
    /// How long to wait for the lease (a duration: `5s`); alone, it means
    /// `onBusy=wait`.
    wait: Option<String>,
}

/// How long `onBusy=wait` waits when no `wait` is given.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

impl<S: ApiStore> Api<S> {
    pub(super) fn key(&self, headers: &HeaderMap, session: &str) -> ApiResult<SessionKey> {
        let tenant: TenantId = self.auth.tenant(headers)?;
        Self::key_of(tenant, session)
    }

    fn key_of(tenant: TenantId, session: &str) -> ApiResult<SessionKey> {
        let session = SessionId::new(session).map_err(|e| {
            ApiError::bad_request(format!("session id: {e}")).with("field", "session")
        })?;
        Ok(SessionKey { tenant, session })
    }

    /// A turn's body, read only once the caller is known and the body says
    /// it is JSON.
    async fn turn_body<T: DeserializeOwned>(
        &self,
        headers: &HeaderMap,
        body: axum::body::Body,
    ) -> ApiResult<T> {
        errors::require_json(headers)?;
        parse_body(errors::read_body(body, self.max_body_bytes).await?)
    }

    pub(super) fn ask(
        &self,
        key: SessionKey,
        input: String,
        turn_seq: Option<u64>,
        query: &TurnQuery,
    ) -> ApiResult<TurnAsk> {
        if input.len() > self.max_input_bytes {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Outcome::TooLarge,
                format!(
                    "field input: {} bytes; the limit is {}",
                    input.len(),
                    self.max_input_bytes
                ),
            )
            .with("field", "input"));
        }
        if input.trim().is_empty() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Outcome::Invalid,
                "field input: must not be empty",
            )
            .with("field", "input"));
        }
        if turn_seq == Some(0) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Outcome::Invalid,
                "field turnSeq: turns count from 1",
            )
            .with("field", "turnSeq"));
        }
        let wait = match &query.wait {
            None => None,
            Some(w) => Some(
                baton_api::validate::parse_duration(w)
                    .ok()
                    .filter(|d| *d <= MAX_WAIT)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "query wait: {w:?} is not a duration between 0s and {}s (e.g. 5s)",
                            MAX_WAIT.as_secs()
                        ))
                        .with("field", "wait")
                    })?,
            ),
        };
        let (wait, interrupt) = match (query.on_busy.as_deref(), wait) {
            (None, wait) => (wait.unwrap_or_default(), false),
            (Some("reject"), None) => (Duration::ZERO, false),
            (Some("reject"), Some(_)) => {
                return Err(ApiError::bad_request(
                    "query onBusy=reject and wait: a turn that rejects a busy session does not wait (leave one out)",
                )
                .with("field", "onBusy"));
            }
            (Some("wait"), wait) => (wait.unwrap_or(DEFAULT_WAIT), false),
            (Some("interrupt"), wait) => (wait.unwrap_or_default(), true),
            (Some(other), _) => {
                return Err(ApiError::bad_request(format!(
                    "query onBusy: {other:?} is not one of reject, wait, interrupt"
                ))
                .with("field", "onBusy"));
            }
        };
        Ok(TurnAsk {
            key,
            input,
            turn_seq,
            wait,
            interrupt,
            live: None,
        })
    }
}

/// Whether the client asked for the turn as a stream.
fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|media| {
            media
                .trim()
                .starts_with(baton_api::agent_contract::stream::CONTENT_TYPE)
        })
}

/// Answers a turn: JSON once it ended, or a stream as it runs.
async fn answer<S: ApiStore>(api: &Api<S>, ask: TurnAsk, stream: bool) -> ApiResult<Response> {
    if stream {
        stream_turn(&api.engine, ask).await
    } else {
        let (_, turn) = spawn_turn(&api.engine, ask);
        let answer = joined(turn.await)?;
        Ok(answer_json(&api.engine.replica, answer))
    }
}

/// Starts the turn in a task of its own (axum drops a handler whose client
/// went away, and a turn cut in half would keep its lease until the TTL),
/// with the copy of its events to the store beside it. The live turn ends
/// as the turn does: with its committed answer (a duplicate's stored one
/// as an attempt 0 of its own), its failure, or closed when it was refused
/// before it started.
fn spawn_turn<S: ApiStore>(
    engine: &Arc<Engine<S>>,
    mut ask: TurnAsk,
) -> (Arc<LiveTurn>, JoinHandle<ApiResult<TurnAnswer>>) {
    let live = Arc::new(LiveTurn::default());
    ask.live = Some(live.clone());
    tokio::spawn({
        let (engine, live, key) = (engine.clone(), live.clone(), ask.key.clone());
        async move { recorder::record(&engine.store, &key, &live).await }
    });
    let session = ask.key.session.to_string();
    let turn = tokio::spawn({
        let (engine, live) = (engine.clone(), live.clone());
        async move {
            let result = engine.turn(ask).await.map_err(ApiError::from);
            match (&result, live.has_started()) {
                (Ok(answer), false) => {
                    live.start(
                        0,
                        answer.turn_seq,
                        json!({
                            "session": session,
                            "turnSeq": answer.turn_seq,
                            "replica": engine.replica,
                            "duplicate": true,
                        })
                        .to_string(),
                    );
                    live.push(Kind::Committed, answer_text(&engine.replica, answer));
                }
                (Ok(answer), true) => {
                    live.push(Kind::Committed, answer_text(&engine.replica, answer))
                }
                (Err(e), true) => live.push(Kind::Failed, e.body().to_string()),
                (Err(_), false) => live.close(),
            }
            result
        }
    });
    (live, turn)
}

/// A turn task's result.
fn joined(ended: Result<ApiResult<TurnAnswer>, JoinError>) -> ApiResult<TurnAnswer> {
    ended.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            Outcome::Internal,
            format!("the turn task failed: {e}"),
        )
    })?
}

/// Runs the turn and answers it as Server-Sent Events. A turn refused
/// before it started (BUSY, GAP, DRAINING, ...) is answered as JSON with
/// its status, as without streaming: only a started turn is a stream.
async fn stream_turn<S: ApiStore>(engine: &Arc<Engine<S>>, ask: TurnAsk) -> ApiResult<Response> {
    let (live, mut turn) = spawn_turn(engine, ask);
    tokio::select! {
        biased;
        () = live.started() => {}
        ended = &mut turn => {
            // Ended: started (a duplicate's answer) or refused.
            if !live.has_started() {
                joined(ended)?;
            }
        }
    }
    Ok(sse_of(live).into_response())
}

/// Follows `live` to its end as Server-Sent Events, with a comment every
/// 15 s so that proxies keep a quiet stream open (an agent may think for a
/// long while before its first word). A client that goes away before the
/// end may come back on another replica: the turn's events then go to the
/// store ([`LiveTurn::want`]).
fn sse_of(
    live: Arc<LiveTurn>,
) -> Sse<impl futures::Stream<Item = Result<axum::response::sse::Event, Infallible>>> {
    let events = futures::stream::unfold(Following::new(live), |mut following| async move {
        let events = following.live.next_from(following.from).await;
        if events.is_empty() {
            following.finished();
            return None;
        }
        following.from += events.len();
        Some((futures::stream::iter(events), following))
    })
    .flat_map(|e| e)
    .map(|e| {
        Ok(axum::response::sse::Event::default()
            .event(e.kind.as_str())
            .id(e.id())
            .data(e.data))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// A client following a live turn here; dropped with its connection.
struct Following {
    live: Arc<LiveTurn>,
    from: usize,
    to_the_end: bool,
}

impl Following {
    fn new(live: Arc<LiveTurn>) -> Self {
        Self {
            live,
            from: 0,
            to_the_end: false,
        }
    }
}

impl Following {
    /// The client was sent the end: nothing to keep for it.
    fn finished(&mut self) {
        self.to_the_end = true;
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        if !self.to_the_end {
            self.live.want();
        }
    }
}

/// The answer to a turn, written straight from the turn's fields (built as
/// a `serde_json::Value`, it cost a dozen allocations per turn).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AnswerBody<'a> {
    status: &'static str,
    reply: &'a str,
    turn_seq: u64,
    state_version: u64,
    replica: &'a str,
    duplicate: bool,
}

impl<'a> AnswerBody<'a> {
    fn of(api_replica: &'a str, a: &'a TurnAnswer) -> Self {
        Self {
            status: if a.duplicate {
                Outcome::Duplicate
            } else {
                Outcome::Ok
            }
            .as_str(),
            reply: &a.reply,
            turn_seq: a.turn_seq,
            state_version: a.version,
            replica: api_replica,
            duplicate: a.duplicate,
        }
    }
}

pub(super) fn answer_json(api_replica: &str, a: TurnAnswer) -> Response {
    Json(AnswerBody::of(api_replica, &a)).into_response()
}

/// The JSON answer as text, for a stream's `committed` event.
fn answer_text(api_replica: &str, a: &TurnAnswer) -> String {
    serde_json::to_string(&AnswerBody::of(api_replica, a)).unwrap_or_default()
}

pub(super) async fn post_turn<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Path(session): Path<String>,
    Query(query): Query<TurnQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<Response> {
    let key = api.key(&headers, &session)?;
    let body: TurnBody = api.turn_body(&headers, body).await?;
    let ask = api.ask(key, body.input, body.turn_seq, &query)?;
    answer(&api, ask, wants_stream(&headers)).await
}

pub(super) async fn post_chat<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Query(query): Query<TurnQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> ApiResult<Response> {
    let tenant = api.auth.tenant(&headers)?;
    let body: ChatBody = api.turn_body(&headers, body).await?;
    let key = Api::<S>::key_of(tenant, &body.session_id).map_err(|e| {
        if e.field("field") == Some(&json!("session")) {
            e.with("field", "sessionId")
        } else {
            e
        }
    })?;
    let ask = api.ask(key, body.input, body.turn_seq, &query)?;
    answer(&api, ask, wants_stream(&headers)).await
}

/// `POST /v1/sessions/{session}/turns/{turnSeq}/interrupt`: stops turn
/// `turnSeq` wherever it runs (a user's Stop). Its replica closes the
/// agent's request within [`crate::engine::LEASE_CHECK`]; nothing it did
/// commits; its client gets INTERRUPTED. 404 when the turn is not running.
pub(super) async fn post_interrupt<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Path((session, turn_seq)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Interrupted>> {
    let key = api.key(&headers, &session)?;
    let turn_seq = super::rejoin::parse_turn_seq("path", &turn_seq)?;
    interrupt(&api, key, Some(turn_seq), "client").await
}

/// Interrupts the turn running on `key` (turn `turn_seq` only, when given).
pub(super) async fn interrupt<S: ApiStore>(
    api: &Api<S>,
    key: SessionKey,
    turn_seq: Option<u64>,
    requested_by: &str,
) -> ApiResult<Json<Interrupted>> {
    let Some(lease) = api.engine.store.interrupt(&key, turn_seq).await? else {
        let which = turn_seq.map_or_else(|| "no turn".to_owned(), |n| format!("turn {n}"));
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            Outcome::NotFound,
            format!("{which} is running on session {key}: nothing to interrupt"),
        ));
    };
    tracing::info!(session = %key, turn_seq = lease.turn_seq, fence = lease.fence, owner = %lease.owner, requested_by, "turn interrupted");
    Ok(Json(Interrupted {
        tenant: key.tenant.to_string(),
        session: key.session.to_string(),
        turn_seq: lease.turn_seq,
        attempt: lease.fence,
        owner: lease.owner,
    }))
}
