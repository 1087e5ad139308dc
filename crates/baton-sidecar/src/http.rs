//! The sidecar's HTTP API: turns (`/v1/sessions/...`, the article's
//! `/api/chat`), session views, admin (drain, status, takeover), probes and
//! metrics. Every refusal is a JSON body `{status, error, ...}` naming the
//! problem; bad input is refused before any store access.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use baton_api::constants::paths;
use baton_session::{SessionCatalog, SessionId, SessionKey, StoreError, TenantId, TurnStore};
use baton_views::{FileList, FileView, ReplicaStatus, SessionView, StateView, Takeover};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::auth::{Auth, AuthError};
use crate::engine::{Engine, TurnAnswer, TurnAsk, TurnError};

/// Longest `?wait=` a client may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Header naming the outcome of every refused request.
pub const OUTCOME_HEADER: &str = "x-baton-outcome";
/// Turns listed in a session view.
const RECENT_TURNS: u32 = 20;

/// Everything the handlers share.
pub struct Api<S> {
    pub engine: Arc<Engine<S>>,
    pub auth: Auth,
    pub max_body_bytes: usize,
    pub max_input_bytes: usize,
}

/// A refusal: HTTP status, outcome name, message, extra fields.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub outcome: &'static str,
    pub message: String,
    /// Fields added to the body (a Vec, not a map: it keeps the error small).
    pub extra: Vec<(&'static str, Value)>,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, outcome: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            outcome,
            message: message.into(),
            extra: Vec::new(),
            retry_after: None,
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }

    fn with(mut self, field: &'static str, value: impl Into<Value>) -> Self {
        self.extra.retain(|(f, _)| *f != field);
        self.extra.push((field, value.into()));
        self
    }

    fn field(&self, name: &str) -> Option<&Value> {
        self.extra.iter().find(|(f, _)| *f == name).map(|(_, v)| v)
    }

    fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self.with("retryAfterMs", after.as_millis() as u64)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::Map::new();
        body.insert("status".into(), self.outcome.into());
        body.insert("error".into(), self.message.into());
        body.extend(self.extra.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let mut response = (self.status, Json(Value::Object(body))).into_response();
        // Proxies (the `baton dev` front door) route on the outcome without
        // parsing the body.
        response
            .headers_mut()
            .insert(OUTCOME_HEADER, HeaderValue::from_static(self.outcome));
        if let Some(after) = self.retry_after {
            // Whole seconds, rounded up: 0 would mean "now".
            let secs = after.as_millis().div_ceil(1000).max(1);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::BadTenant(_) => Self::bad_request(e.to_string()),
            AuthError::Missing | AuthError::Unknown => {
                Self::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", e.to_string())
            }
            AuthError::NotAdmin => Self::new(StatusCode::FORBIDDEN, "FORBIDDEN", e.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = e.to_string();
        match e {
            StoreError::TooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "TOO_LARGE", message)
            }
            StoreError::InvalidId(_) => Self::bad_request(message),
            StoreError::Unavailable(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "STORE_UNAVAILABLE",
                message,
            )
            .retry_after(Duration::from_secs(1)),
            StoreError::Corrupt(_) => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "CORRUPT", message)
            }
        }
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        use crate::agent_client::AgentCallError;
        use baton_session::workspace::WorkspaceError;
        let message = e.to_string();
        let outcome = e.outcome();
        let status = |code: StatusCode| Self::new(code, outcome, message.clone());
        let retry_soon = Duration::from_secs(1);
        match e {
            TurnError::Busy {
                owner, retry_after, ..
            } => status(StatusCode::CONFLICT)
                .with("owner", owner)
                .retry_after(retry_after),
            TurnError::Conflict { current_version } => {
                status(StatusCode::CONFLICT).with("currentVersion", current_version)
            }
            TurnError::LeaseLost => status(StatusCode::CONFLICT),
            TurnError::Gap { next_turn_seq } => {
                status(StatusCode::CONFLICT).with("nextTurnSeq", next_turn_seq)
            }
            TurnError::TurnSeqReused { turn_seq } => status(StatusCode::UNPROCESSABLE_ENTITY)
                .with("turnSeq", turn_seq)
                .with("field", "turnSeq"),
            TurnError::Stale { last_turn_seq } => {
                status(StatusCode::CONFLICT).with("lastTurnSeq", last_turn_seq)
            }
            TurnError::StateLost { last_version } => {
                status(StatusCode::SERVICE_UNAVAILABLE).with("lastVersion", last_version)
            }
            // Never started here: any replica may take it (the front door does).
            TurnError::Draining => status(StatusCode::SERVICE_UNAVAILABLE).retry_after(retry_soon),
            // Nothing committed, but the agent ran: the client decides.
            TurnError::AbortedByDrain => {
                status(StatusCode::SERVICE_UNAVAILABLE).retry_after(retry_soon)
            }
            TurnError::CommitUnknown { turn_seq } => status(StatusCode::SERVICE_UNAVAILABLE)
                .with("turnSeq", turn_seq)
                .retry_after(retry_soon),
            TurnError::Agent(AgentCallError::Timeout(_)) => status(StatusCode::GATEWAY_TIMEOUT),
            // Not listening: nothing ran, retrying is safe.
            TurnError::Agent(AgentCallError::Unreachable(_)) => {
                status(StatusCode::SERVICE_UNAVAILABLE).retry_after(retry_soon)
            }
            TurnError::Agent(_)
            | TurnError::BadAgentState(_)
            | TurnError::Workspace(WorkspaceError::Refused { .. }) => {
                status(StatusCode::BAD_GATEWAY)
            }
            TurnError::Workspace(
                WorkspaceError::BadManifest(..)
                | WorkspaceError::Corrupt { .. }
                | WorkspaceError::Io(_),
            ) => status(StatusCode::INTERNAL_SERVER_ERROR),
            TurnError::Workspace(WorkspaceError::Store(_)) => {
                status(StatusCode::SERVICE_UNAVAILABLE).retry_after(retry_soon)
            }
            TurnError::Store(e) => e.into(),
        }
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body strictly: 413 when too large, 400 when not JSON,
/// 422 naming the field when the shape is wrong.
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> ApiResult<T> {
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let outcome = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "TOO_LARGE"
        } else {
            "BAD_REQUEST"
        };
        ApiError::new(
            status,
            outcome,
            format!("request body: {}", rejection.body_text()),
        )
    })?;
    let mut de = serde_json::Deserializer::from_slice(&body);
    let parsed: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_data() {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID",
                format!("field {path}: {inner}"),
            )
            .with("field", path)
        } else {
            ApiError::bad_request(format!("request body is not valid JSON: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("request body has trailing data: {e}")))?;
    Ok(parsed)
}

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
    fn key(&self, headers: &HeaderMap, session: &str) -> ApiResult<SessionKey> {
        let tenant: TenantId = self.auth.tenant(headers)?;
        let session = SessionId::new(session).map_err(|e| {
            ApiError::bad_request(format!("session id: {e}")).with("field", "session")
        })?;
        Ok(SessionKey { tenant, session })
    }

    fn ask(
        &self,
        key: SessionKey,
        input: String,
        turn_seq: Option<u64>,
        query: &TurnQuery,
    ) -> ApiResult<TurnAsk> {
        if input.len() > self.max_input_bytes {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "TOO_LARGE",
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
                "INVALID",
                "field input: must not be empty",
            )
            .with("field", "input"));
        }
        if turn_seq == Some(0) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "INVALID",
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
        })
    }
}

/// Runs the turn in its own task: axum drops a handler whose client went
/// away, and a turn cut in half would keep its lease until the TTL.
async fn run_to_completion<S: TurnStore + SessionCatalog + 'static>(
    engine: &Arc<Engine<S>>,
    ask: TurnAsk,
) -> ApiResult<TurnAnswer> {
    let engine = engine.clone();
    let turn = tokio::spawn(async move { engine.turn(ask).await });
    match turn.await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL",
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

fn answer_json(api_replica: &str, a: TurnAnswer) -> Response {
    Json(AnswerBody {
        status: if a.duplicate { "DUPLICATE" } else { "OK" },
        reply: &a.reply,
        turn_seq: a.turn_seq,
        state_version: a.version,
        replica: api_replica,
        duplicate: a.duplicate,
    })
    .into_response()
}

async fn post_turn<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(session): Path<String>,
    Query(query): Query<TurnQuery>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let key = api.key(&headers, &session)?;
    let body: TurnBody = parse_body(body)?;
    let ask = api.ask(key, body.input, body.turn_seq, &query)?;
    let answer = run_to_completion(&api.engine, ask).await?;
    Ok(answer_json(&api.engine.replica, answer))
}

async fn post_chat<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Query(query): Query<TurnQuery>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body: ChatBody = parse_body(body)?;
    let key = api.key(&headers, &body.session_id).map_err(|e| {
        if e.field("field") == Some(&json!("session")) {
            e.with("field", "sessionId")
        } else {
            e
        }
    })?;
    let ask = api.ask(key, body.input, body.turn_seq, &query)?;
    let answer = run_to_completion(&api.engine, ask).await?;
    Ok(answer_json(&api.engine.replica, answer))
}

#[derive(Debug, Default, Deserialize)]
pub struct SessionQuery {
    #[serde(default)]
    state: bool,
}

async fn get_session<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(session): Path<String>,
    Query(query): Query<SessionQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<SessionView>> {
    let key = api.key(&headers, &session)?;
    let store = &api.engine.store;
    let Some(view) = store.session(&key).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("session {key} has no state"),
        ));
    };
    let turns = store.turns(&key, RECENT_TURNS).await?;
    let state = if query.state {
        store.read_state(&key).await?.map(|s| StateView {
            version: s.version,
            payload: if s.payload.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice::<Value>(&s.payload).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&s.payload).into_owned())
                })
            },
        })
    } else {
        None
    };
    Ok(Json(view.to_view(&turns, state)))
}

/// The committed workspace reference of `key`, or 404.
async fn committed_workspace<S: TurnStore>(
    engine: &Engine<S>,
    key: &SessionKey,
) -> ApiResult<(u64, Option<String>)> {
    match engine.store.read_state(key).await? {
        Some(s) => Ok((s.version, s.workspace)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("session {key} has no state"),
        )),
    }
}

async fn list_files<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path(session): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<FileList>> {
    let key = api.key(&headers, &session)?;
    let (version, reference) = committed_workspace(&api.engine, &key).await?;
    let files = match &reference {
        Some(r) => api
            .engine
            .workspaces
            .load_manifest(r)
            .await
            .map_err(TurnError::from)?
            .files
            .into_iter()
            .map(|(name, f)| {
                let view = FileView {
                    size: f.size,
                    sha256: f.blob,
                };
                (name, view)
            })
            .collect(),
        None => BTreeMap::new(),
    };
    Ok(Json(FileList { version, files }))
}

async fn get_file<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path((session, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let key = api.key(&headers, &session)?;
    let (_, reference) = committed_workspace(&api.engine, &key).await?;
    let missing = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("session {key} has no file {name:?}"),
        )
    };
    let reference = reference.ok_or_else(missing)?;
    let content = api
        .engine
        .workspaces
        .read_file(&reference, &name)
        .await
        .map_err(TurnError::from)?
        .ok_or_else(missing)?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        content,
    )
        .into_response())
}

/// The admin API is for operators: with authentication on it needs an
/// admin token (a tenant's token is not one).
fn admin<S>(api: &Api<S>, headers: &HeaderMap) -> ApiResult<()> {
    api.auth.admin(headers)?;
    Ok(())
}

fn status<S: TurnStore + 'static>(engine: &Engine<S>) -> ReplicaStatus {
    let turns = engine.inflight.snapshot();
    ReplicaStatus {
        replica: engine.replica.clone(),
        holder: engine.holder.to_string(),
        draining: engine.inflight.is_draining(),
        ready: !engine.inflight.is_draining() && engine.stores_answer(),
        in_flight: turns.len() as u64,
        turns,
        oldest_unshipped_ms: engine.store.oldest_unshipped_ms(),
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct DrainQuery {
    #[serde(default)]
    wait: bool,
}

async fn post_drain<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Query(query): Query<DrainQuery>,
    headers: HeaderMap,
) -> ApiResult<(StatusCode, Json<ReplicaStatus>)> {
    admin(&api, &headers)?;
    api.engine.start_drain();
    if query.wait {
        api.engine.drained().await;
        return Ok((StatusCode::OK, Json(status(&api.engine))));
    }
    Ok((StatusCode::ACCEPTED, Json(status(&api.engine))))
}

/// kubelet's preStop hook: drain, and answer once no turn runs.
async fn prestop<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    headers: HeaderMap,
) -> ApiResult<Json<ReplicaStatus>> {
    admin(&api, &headers)?;
    api.engine.start_drain();
    api.engine.drained().await;
    Ok(Json(status(&api.engine)))
}

async fn get_status<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    headers: HeaderMap,
) -> ApiResult<Json<ReplicaStatus>> {
    admin(&api, &headers)?;
    Ok(Json(status(&api.engine)))
}

/// Takeover is an operator's act (the rollout, the dashboard): it fences
/// out whoever holds the session, so it needs an admin token, and names the
/// tenant in the path since an admin token belongs to no tenant.
async fn post_takeover<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path((tenant, session)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Takeover>> {
    admin(&api, &headers)?;
    let tenant = TenantId::new(tenant)
        .map_err(|e| ApiError::bad_request(format!("tenant: {e}")).with("field", "tenant"))?;
    let session = SessionId::new(session)
        .map_err(|e| ApiError::bad_request(format!("session id: {e}")).with("field", "session"))?;
    let key = SessionKey { tenant, session };
    let revoked = api.engine.store.revoke(&key).await?;
    tracing::info!(session = %key, revoked = ?revoked, "takeover");
    Ok(Json(Takeover {
        tenant: key.tenant.to_string(),
        session: key.session.to_string(),
        revoked_owner: revoked,
    }))
}

async fn readyz<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
) -> ApiResult<&'static str> {
    if api.engine.inflight.is_draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "DRAINING",
            "this replica is draining",
        ));
    }
    if !api.engine.stores_answer() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "STORE_UNAVAILABLE",
            "the stores did not answer the last heartbeats",
        ));
    }
    if !api.engine.agent.reachable().await {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "AGENT_UNAVAILABLE",
            "the agent does not accept connections",
        ));
    }
    Ok("ready\n")
}

async fn metrics<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        api.engine.metrics.encode(),
    )
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such route")
}

/// Refuses a body whose announced length is over the limit before reading
/// any of it (the body limit alone would read up to the limit first).
async fn announced_length(
    State(limit): State<usize>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match announced {
        Some(length) if length > limit as u64 => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "TOO_LARGE",
            format!("request body: {length} bytes; the limit is {limit}"),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Every route of the sidecar.
pub fn router<S: TurnStore + SessionCatalog + 'static>(api: Arc<Api<S>>) -> Router {
    let limit = api.max_body_bytes;
    Router::new()
        .route("/v1/sessions/{session}/turns", post(post_turn::<S>))
        .route("/v1/sessions/{session}", get(get_session::<S>))
        .route("/v1/sessions/{session}/files", get(list_files::<S>))
        .route("/v1/sessions/{session}/files/{*name}", get(get_file::<S>))
        .route("/api/chat", post(post_chat::<S>))
        .route("/v1/admin/drain", post(post_drain::<S>))
        .route(paths::PRESTOP, get(prestop::<S>))
        .route("/v1/admin/status", get(get_status::<S>))
        .route(
            "/v1/admin/tenants/{tenant}/sessions/{session}/takeover",
            post(post_takeover::<S>),
        )
        .route(paths::HEALTHZ, get(|| async { "ok\n" }))
        .route(paths::READYZ, get(readyz::<S>))
        .route("/metrics", get(metrics::<S>))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            limit,
            announced_length,
        ))
        .with_state(api)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(body: &[u8]) -> ApiResult<TurnBody> {
        parse_body(Ok(Bytes::copy_from_slice(body)))
    }

    #[test]
    fn bodies_are_parsed_strictly_with_the_field_named() {
        let ok = parse(br#"{"input":"hi","turnSeq":3}"#).unwrap();
        assert_eq!((ok.input.as_str(), ok.turn_seq), ("hi", Some(3)));
        let e = parse(br#"{"input":"hi""#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse(br#"{"input":5}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.contains("field input"), "{}", e.message);
        let e = parse(br#"{"input":"hi","turnSeq":-1}"#).unwrap_err();
        assert!(e.message.contains("field turnSeq"), "{}", e.message);
        let e = parse(br#"{"input":"hi","admin":true}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.contains("admin"), "{}", e.message);
        let e = parse(br#"{"input":"hi"} {"input":"again"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse(br#"{}"#).unwrap_err();
        assert!(e.message.contains("input"), "{}", e.message);
    }

    proptest! {
        /// Whatever bytes arrive, the parser answers a body or a 400/422
        /// with a message — it never panics and never answers 5xx.
        #[test]
        fn any_body_gets_a_body_or_a_client_error(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            match parse(&body) {
                Ok(_) => {}
                Err(e) => {
                    prop_assert!(e.status.is_client_error());
                    prop_assert!(!e.message.is_empty());
                }
            }
        }

        /// JSON-ish bodies built from the real fields and hostile values.
        #[test]
        fn json_shaped_bodies_never_panic(
            input in prop_oneof![Just("\"hi\"".to_string()), Just("null".to_string()), Just("[]".to_string()), Just("1e999".to_string()), "\"[^\"]{0,40}\""],
            seq in prop_oneof![Just("1".to_string()), Just("-1".to_string()), Just("18446744073709551616".to_string()), Just("\"3\"".to_string()), Just("null".to_string())],
        ) {
            let body = format!("{{\"input\":{input},\"turnSeq\":{seq}}}");
            if let Err(e) = parse(body.as_bytes()) {
                prop_assert!(e.status.is_client_error());
            }
        }
    }
}
