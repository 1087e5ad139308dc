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

use super::*;
use crate::live::{Kind, LiveTurn};
use crate::outcome::Outcome;

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

#[derive(Debug, Default, Deserialize)]
pub struct TurnQuery {
    wait: Option<String>,
}

impl<S: TurnStore + SessionCatalog + 'static> Api<S> {
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
            None => Duration::ZERO,
            Some(w) => baton_api::validate::parse_duration(w)
                .ok()
                .filter(|d| *d <= MAX_WAIT)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "query wait: {w:?} is not a duration between 0s and {}s (e.g. 5s)",
                        MAX_WAIT.as_secs()
                    ))
                    .with("field", "wait")
                })?,
        };
        Ok(TurnAsk {
            key,
            input,
            turn_seq,
            wait,
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
async fn answer<S: TurnStore + SessionCatalog + 'static>(
    api: &Api<S>,
    ask: TurnAsk,
    stream: bool,
) -> ApiResult<Response> {
    if stream {
        stream_turn(&api.engine, ask).await
    } else {
        let answer = run_to_completion(&api.engine, ask).await?;
        Ok(answer_json(&api.engine.replica, answer))
    }
}

/// Runs the turn and answers it as Server-Sent Events. A turn refused
/// before it started (BUSY, GAP, DRAINING, ...) is answered as JSON with
/// its status, as without streaming: only a started turn is a stream.
async fn stream_turn<S: TurnStore + SessionCatalog + 'static>(
    engine: &Arc<Engine<S>>,
    mut ask: TurnAsk,
) -> ApiResult<Response> {
    let live = Arc::new(LiveTurn::default());
    ask.live = Some(live.clone());
    let session = ask.key.session.to_string();
    let mut turn = tokio::spawn({
        let (engine, live) = (engine.clone(), live.clone());
        async move {
            let result = engine.turn(ask).await.map_err(ApiError::from);
            if live.has_started() {
                match &result {
                    Ok(answer) => live.push(Kind::Committed, answer_text(&engine.replica, answer)),
                    Err(e) => live.push(Kind::Failed, e.body().to_string()),
                }
            }
            result
        }
    });
    tokio::select! {
        biased;
        () = live.started() => {}
        ended = &mut turn => {
            // Ended before it started: refused, or a duplicate's stored
            // answer (a stream of its own: the turn and the answer).
            if !live.has_started() {
                let answer = ended
                    .map_err(|e| ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        Outcome::Internal,
                        format!("the turn task failed: {e}"),
                    ))??;
                live.push(
                    Kind::Turn,
                    json!({
                        "session": session,
                        "turnSeq": answer.turn_seq,
                        "replica": engine.replica,
                        "duplicate": true,
                    })
                    .to_string(),
                );
                live.push(Kind::Committed, answer_text(&engine.replica, &answer));
            }
        }
    }
    Ok(sse_of(live).into_response())
}

/// Follows `live` to its end as Server-Sent Events, with a comment every
/// 15 s so that proxies keep a quiet stream open (an agent may think for a
/// long while before its first word).
fn sse_of(
    live: Arc<LiveTurn>,
) -> Sse<impl futures::Stream<Item = Result<axum::response::sse::Event, Infallible>>> {
    let events = futures::stream::unfold((live, 0usize), |(live, from)| async move {
        let events = live.next_from(from).await;
        if events.is_empty() {
            return None;
        }
        let next = from + events.len();
        Some((futures::stream::iter(events), (live, next)))
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

/// Runs the turn in its own task: axum drops a handler whose client went
/// away, and a turn cut in half would keep its lease until the TTL.
pub(super) async fn run_to_completion<S: TurnStore + SessionCatalog + 'static>(
    engine: &Arc<Engine<S>>,
    ask: TurnAsk,
) -> ApiResult<TurnAnswer> {
    let engine = engine.clone();
    let turn = tokio::spawn(async move { engine.turn(ask).await });
    match turn.await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            Outcome::Internal,
            format!("the turn task failed: {e}"),
        )),
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

pub(super) async fn post_turn<S: TurnStore + SessionCatalog + 'static>(
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

pub(super) async fn post_chat<S: TurnStore + SessionCatalog + 'static>(
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
