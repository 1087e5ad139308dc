//! Refusals: every error the API answers is a JSON body `{status, error,
//! ...}` with the outcome in a header, mapped here from the auth, store and
//! turn errors; and the strict JSON body parser.

use super::*;
use crate::outcome::Outcome;

/// A refusal: HTTP status, outcome name, message, extra fields.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub outcome: Outcome,
    pub message: String,
    /// Fields added to the body (a Vec, not a map: it keeps the error small).
    pub extra: Vec<(&'static str, Value)>,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, outcome: Outcome, message: impl Into<String>) -> Self {
        Self {
            status,
            outcome,
            message: message.into(),
            extra: Vec::new(),
            retry_after: None,
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Outcome::BadRequest, message)
    }

    pub(super) fn with(mut self, field: &'static str, value: impl Into<Value>) -> Self {
        self.extra.retain(|(f, _)| *f != field);
        self.extra.push((field, value.into()));
        self
    }

    pub(super) fn field(&self, name: &str) -> Option<&Value> {
        self.extra.iter().find(|(f, _)| *f == name).map(|(_, v)| v)
    }

    pub(super) fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self.with("retryAfterMs", after.as_millis() as u64)
    }
}

impl ApiError {
    /// The body every refusal answers: `{status, error, ...}`.
    pub fn body(&self) -> Value {
        let mut body = serde_json::Map::new();
        body.insert("status".into(), self.outcome.as_str().into());
        body.insert("error".into(), self.message.clone().into());
        body.extend(self.extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        Value::Object(body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        // Proxies (the `baton dev` front door) route on the outcome without
        // parsing the body.
        response.headers_mut().insert(
            OUTCOME_HEADER,
            HeaderValue::from_static(self.outcome.as_str()),
        );
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
            AuthError::Missing | AuthError::Unknown => Self::new(
                StatusCode::UNAUTHORIZED,
                Outcome::Unauthorized,
                e.to_string(),
            ),
            AuthError::NotAdmin => {
                Self::new(StatusCode::FORBIDDEN, Outcome::Forbidden, e.to_string())
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = e.to_string();
        match e {
            StoreError::TooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, Outcome::TooLarge, message)
            }
            StoreError::InvalidId(_) => Self::bad_request(message),
            StoreError::Unavailable(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Outcome::StoreUnavailable,
                message,
            )
            .retry_after(Duration::from_secs(1)),
            StoreError::Corrupt(_) => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, Outcome::Corrupt, message)
            }
        }
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        use crate::agent_client::AgentCallError;
        use baton_workspace::WorkspaceError;
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
            TurnError::LayoutMismatch { layout, store } => status(StatusCode::SERVICE_UNAVAILABLE)
                .with("layout", layout)
                .with("storeLayout", store)
                .retry_after(retry_soon),
            // Nothing committed, but the agent ran: the client decides.
            TurnError::AbortedByDrain => {
                status(StatusCode::SERVICE_UNAVAILABLE).retry_after(retry_soon)
            }
            // Someone asked for it: not worth a retry.
            TurnError::Interrupted => status(StatusCode::CONFLICT),
            TurnError::CommitUnknown { turn_seq } => status(StatusCode::SERVICE_UNAVAILABLE)
                .with("turnSeq", turn_seq)
                .retry_after(retry_soon),
            TurnError::Agent(AgentCallError::Timeout(_)) => status(StatusCode::GATEWAY_TIMEOUT),
            // Not listening: nothing ran, retrying is safe.
            TurnError::Agent(AgentCallError::Unreachable(_)) => {
                status(StatusCode::SERVICE_UNAVAILABLE).retry_after(retry_soon)
            }
            TurnError::Agent(_) | TurnError::BadAgentState(_) => status(StatusCode::BAD_GATEWAY),
            // The agent left a file the workspace cannot hold: named, so
            // the agent's author can tell which.
            TurnError::Workspace(WorkspaceError::Refused { path, .. }) => {
                status(StatusCode::BAD_GATEWAY).with("file", path)
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

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// Parses a JSON body strictly (read by `read_body`): 400 when not JSON,
/// 422 naming the field when the shape is wrong.
pub fn parse_body<T: DeserializeOwned>(body: Bytes) -> ApiResult<T> {
    let mut de = serde_json::Deserializer::from_slice(&body);
    let parsed: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_data() {
            // A missing field is reported at the object holding it (".");
            // name the field itself, which serde's message quotes.
            let field = match (path.as_str(), missing_field(&inner.to_string())) {
                (".", Some(missing)) => missing,
                _ => path,
            };
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Outcome::Invalid,
                format!("field {field}: {inner}"),
            )
            .with("field", field)
        } else {
            ApiError::bad_request(format!("request body is not valid JSON: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("request body has trailing data: {e}")))?;
    Ok(parsed)
}

/// The field serde's "missing field `x`" names.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

/// A request body must say it is JSON. `application/x-www-form-urlencoded`,
/// `multipart/form-data` and `text/plain` are what a page on another site
/// may send without the browser asking this server first (CORS), so a
/// body of those types never runs a turn.
pub fn require_json(headers: &HeaderMap) -> ApiResult<()> {
    let given = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = given.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    let said = if given.is_empty() {
        "none".to_owned()
    } else {
        format!("{:?}", given.chars().take(64).collect::<String>())
    };
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Outcome::UnsupportedMediaType,
        format!(
            "header content-type: must be application/json (given: {said}); with curl, use --json"
        ),
    )
    .with("field", "content-type"))
}

/// Reads a request body of at most `limit` bytes, once the caller has
/// checked who is asking (a body is never read for a refused request).
pub async fn read_body(body: axum::body::Body, limit: usize) -> ApiResult<Bytes> {
    let deadline = baton_serve::BODY_READ_TIMEOUT;
    let read = tokio::time::timeout(deadline, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                Outcome::RequestTimeout,
                format!("request body: not all received within {deadline:?}"),
            )
        })?;
    read.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Outcome::TooLarge,
                format!("request body: over the limit of {limit} bytes"),
            )
        } else {
            ApiError::bad_request(format!("request body: {e}"))
        }
    })
}
