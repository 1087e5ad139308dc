//! The sidecar's HTTP API: turns (`/v1/sessions/...`, the article's
//! `/api/chat`), session views, admin (drain, status, takeover), probes and
//! metrics. Every refusal is a JSON body `{status, error, ...}` naming the
//! problem; bad input is refused before any store access.
//!
//! Here: the router, the shared state and the body limits. The handlers are
//! in `turns.rs`, `sessions.rs` and `admin.rs` (admin, probes, metrics);
//! `errors.rs` maps every failure to its refusal and parses bodies.

use crate::outcome::Outcome;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use baton_api::constants::paths;
use baton_session::turn_stream::TurnStreams;
use baton_session::{SessionCatalog, SessionId, SessionKey, StoreError, TenantId, TurnStore};
use baton_views::{
    FileList, FileView, Handover, Interrupted, ReplicaStatus, SessionView, StateView, Takeover,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::auth::{Auth, AuthError};
use crate::engine::{Engine, TurnAnswer, TurnAsk, TurnError};

mod admin;
mod errors;
mod rejoin;
mod sessions;
mod turns;

use admin::*;
use errors::ApiResult;
pub use errors::{ApiError, parse_body};
use rejoin::get_turn_stream;
use sessions::*;
use turns::*;
pub use turns::{ChatBody, TurnBody, TurnQuery};

/// Longest `?wait=` a client may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Header naming the outcome of every refused request.
pub const OUTCOME_HEADER: &str = "x-baton-outcome";
/// Turns listed in a session view.
const RECENT_TURNS: u32 = 20;

/// What the API needs of a backend: turns, the dashboard's reads, and
/// turn streams.
pub trait ApiStore: TurnStore + SessionCatalog + TurnStreams + 'static {}

impl<S: TurnStore + SessionCatalog + TurnStreams + 'static> ApiStore for S {}

/// Everything the handlers share.
pub struct Api<S> {
    pub engine: Arc<Engine<S>>,
    pub auth: Auth,
    pub max_body_bytes: usize,
    pub max_input_bytes: usize,
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, Outcome::NotFound, "no such route")
}

/// A known route asked with a method it does not serve: the same JSON
/// error shape as every other refusal (axum's default has no body).
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        Outcome::MethodNotAllowed,
        format!("{} does not serve {method}", uri.path()),
    )
    .into_response()
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
            Outcome::TooLarge,
            format!("request body: {length} bytes; the limit is {limit}"),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// axum's own refusals (a query or path parameter it cannot read) are
/// plain text: give them the JSON error shape and the outcome header that
/// every other refusal has, keeping their status and message.
pub async fn json_refusals(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !status.is_client_error() || response.headers().contains_key(OUTCOME_HEADER) {
        return response;
    }
    let outcome = match status {
        StatusCode::NOT_FOUND => Outcome::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => Outcome::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => Outcome::TooLarge,
        StatusCode::UNPROCESSABLE_ENTITY => Outcome::Invalid,
        _ => Outcome::BadRequest,
    };
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let message = String::from_utf8_lossy(&body).trim().to_owned();
    ApiError::new(status, outcome, message).into_response()
}

/// A draining replica closes every connection after its answer: a client
/// behind a Service (an L4 proxy that picks a pod per connection) then
/// reconnects and lands on a replica that serves, instead of hearing
/// DRAINING on its kept-alive connection until the pod is gone.
async fn close_when_draining<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    if api.engine.inflight.is_draining() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Which routes a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    /// Turns, session views, probes, metrics and the admin API: one
    /// listener for everything (`baton dev`, a sidecar without
    /// `--admin-listen`).
    All,
    /// Everything but the admin API, which answers on a listener of its own
    /// (`--admin-listen`), so a NetworkPolicy can let only the operator and
    /// the dashboard reach it.
    Public,
    /// The admin API alone (drain, status, handover, takeover).
    Admin,
}

/// The routes `routes` names, with the refusals, limits and draining
/// behaviour every listener shares.
pub fn router<S: ApiStore>(api: Arc<Api<S>>, routes: Routes) -> Router {
    let limit = api.max_body_bytes;
    let mut router = Router::new();
    if routes != Routes::Admin {
        router = router
            .route("/v1/sessions/{session}/turns", post(post_turn::<S>))
            .route(
                "/v1/sessions/{session}/turns/{turn_seq}/stream",
                get(get_turn_stream::<S>),
            )
            .route(
                "/v1/sessions/{session}/turns/{turn_seq}/interrupt",
                post(post_interrupt::<S>),
            )
            .route("/v1/sessions/{session}", get(get_session::<S>))
            .route("/v1/sessions/{session}/files", get(list_files::<S>))
            .route("/v1/sessions/{session}/files/{*name}", get(get_file::<S>))
            .route("/api/chat", post(post_chat::<S>))
            .route(paths::DRAINED, get(drained::<S>))
            .route("/metrics", get(metrics::<S>));
    }
    if routes != Routes::Public {
        router = router
            .route(paths::DRAIN, post(post_drain::<S>))
            .route(paths::STATUS, get(get_status::<S>))
            .route(paths::HANDOVER, post(post_handover::<S>))
            .route(
                "/v1/admin/tenants/{tenant}/sessions/{session}/takeover",
                post(post_takeover::<S>),
            )
            .route(
                "/v1/admin/tenants/{tenant}/sessions/{session}/interrupt",
                post(post_admin_interrupt::<S>),
            );
    }
    router
        // Probes answer on every listener: the kubelet checks each port.
        .route(paths::HEALTHZ, get(|| async { "ok\n" }))
        .route(paths::READYZ, get(readyz::<S>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(json_refusals))
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            close_when_draining::<S>,
        ))
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
        parse_body(Bytes::copy_from_slice(body))
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
        // A missing field is named, not the object holding it.
        assert_eq!(e.field("field"), Some(&json!("input")), "{}", e.message);
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
