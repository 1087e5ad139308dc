//! The front door: what a Kubernetes Service is to the replicas. It sends
//! each request to the next ready replica, and tries another one when a
//! replica refuses the connection or answers DRAINING — both mean the turn
//! never started there, so a retry cannot run it twice.

use baton_sidecar::outcome::Outcome;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::replica::ReplicaSlot;

/// Largest request body the front door passes on: the sidecars' own limit
/// (`baton dev` starts them with the default), so an oversized body is
/// refused here, before the front door holds any of it.
pub const MAX_FORWARD_BYTES: usize = baton_sidecar::config::DEFAULT_MAX_BODY_BYTES;

/// Header on every forwarded answer: the replica that served it.
pub const REPLICA_HEADER: &str = "x-baton-replica";

pub struct FrontDoor {
    pub slots: Vec<Arc<ReplicaSlot>>,
    next: AtomicUsize,
    http: reqwest::Client,
}

/// Hop-by-hop headers are not forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// What a client of the front door may reach on a replica: the turn and
/// session API and the probes. Never the admin API (drain, takeover,
/// status): the front door connects from loopback, and what it forwards
/// comes from anyone who can reach it.
///
/// A path with a dot segment (`..`, `%2e%2e`, …) or a backslash is no
/// route: the forwarding client's URL parser would resolve
/// `/v1/sessions/../admin/drain` to the admin API.
pub fn client_route(path: &str) -> bool {
    let dot_segment = path.split('/').any(|segment| {
        let segment = segment.to_ascii_lowercase().replace("%2e", ".");
        segment == "." || segment == ".."
    });
    if dot_segment || path.contains('\\') {
        return false;
    }
    path == "/api/chat"
        || path.starts_with("/v1/sessions/")
        || path == baton_api::constants::paths::HEALTHZ
        || path == baton_api::constants::paths::READYZ
}

/// The sidecar's error shape (body and `x-baton-outcome`), for the front
/// door's own refusals.
fn refusal(status: StatusCode, outcome: Outcome, message: String) -> Response {
    let mut r = (
        status,
        axum::Json(json!({ "status": outcome.as_str(), "error": message })),
    )
        .into_response();
    r.headers_mut().insert(
        baton_sidecar::http::OUTCOME_HEADER,
        HeaderValue::from_static(outcome.as_str()),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

impl FrontDoor {
    pub fn new(slots: Vec<Arc<ReplicaSlot>>) -> Self {
        Self {
            slots,
            next: AtomicUsize::new(0),
            // No idle connections kept: a request written into a pooled
            // connection to a replica that was just killed fails like one
            // the replica started and died in, which must not be retried.
            // A fresh connection to a dead replica is refused instead, which
            // is retried safely. Loopback connects are cheap.
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(1))
                .pool_max_idle_per_host(0)
                .build()
                .unwrap_or_default(),
        }
    }

    /// The ready replicas, starting with the next one in round-robin order.
    fn candidates(&self) -> Vec<Arc<ReplicaSlot>> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.slots.len();
        (0..n)
            .map(|i| self.slots[(start + i) % n].clone())
            .filter(|s| {
                let status = s.status();
                status.ready && !status.draining
            })
            .collect()
    }

    pub async fn forward(self: Arc<Self>, req: Request) -> Response {
        if !client_route(req.uri().path()) {
            return refusal(
                StatusCode::NOT_FOUND,
                Outcome::NotFound,
                format!(
                    "{}: the front door passes on the client API only (/api/chat, /v1/sessions/…, /healthz, /readyz); drain and take over from the dashboard (/dashboard) or with `baton dev rollout`",
                    req.uri().path()
                ),
            );
        }
        let too_large = |what: String| {
            refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                Outcome::TooLarge,
                format!("request body: {what}; the limit is {MAX_FORWARD_BYTES} bytes"),
            )
        };
        let announced = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(length) = announced.filter(|l| *l > MAX_FORWARD_BYTES as u64) {
            return too_large(format!("{length} bytes"));
        }
        let (parts, body) = req.into_parts();
        let deadline = baton_serve::BODY_READ_TIMEOUT;
        let read = tokio::time::timeout(deadline, axum::body::to_bytes(body, MAX_FORWARD_BYTES));
        let body = match read.await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return too_large(format!("{e}")),
            Err(_) => {
                return refusal(
                    StatusCode::REQUEST_TIMEOUT,
                    Outcome::RequestTimeout,
                    format!("request body: not all received within {deadline:?}"),
                );
            }
        };
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        let mut last_draining = None;
        for slot in self.candidates() {
            // Between a replica's processes: nothing listens.
            let Some(base) = slot.url() else { continue };
            let mut outgoing = self
                .http
                .request(parts.method.clone(), format!("{base}{path}"))
                .body(body.clone());
            for (name, value) in &parts.headers {
                if !hop_by_hop(name) {
                    outgoing = outgoing.header(name, value);
                }
            }
            match outgoing.send().await {
                Err(e) if e.is_connect() => {
                    // Never reached the replica: it is down or restarting.
                    slot.set_probe(false, false);
                    continue;
                }
                Err(e) => {
                    // The replica may have started the turn; only the client,
                    // with its turnSeq, can retry safely.
                    return refusal(
                        StatusCode::BAD_GATEWAY,
                        Outcome::ReplicaFailed,
                        // `{:#}` prints the error with its causes ("error
                        // sending request" alone says little).
                        format!(
                            "{} failed during the request: {:#}",
                            slot.id,
                            anyhow::Error::new(e)
                        ),
                    );
                }
                Ok(answer) => {
                    let draining = answer.status() == StatusCode::SERVICE_UNAVAILABLE
                        && answer
                            .headers()
                            .get("x-baton-outcome")
                            .is_some_and(|v| v == "DRAINING");
                    let response = relay(answer, &slot.id).await;
                    if draining {
                        slot.set_probe(false, true);
                        last_draining = Some(response);
                        continue;
                    }
                    return response;
                }
            }
        }
        last_draining.unwrap_or_else(|| {
            refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                Outcome::NoReplica,
                "no replica is ready; retry shortly".into(),
            )
        })
    }
}

async fn relay(answer: reqwest::Response, replica: &str) -> Response {
    let status = answer.status();
    let mut headers = HeaderMap::new();
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(replica) {
        headers.insert(REPLICA_HEADER, v);
    }
    // A streamed turn goes on as the replica writes it: buffered, its
    // client would see every word at once, at the end.
    let streamed = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(baton_api::agent_contract::stream::CONTENT_TYPE));
    if streamed {
        let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        return response;
    }
    match answer.bytes().await {
        Ok(bytes) => {
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        Err(e) => refusal(
            StatusCode::BAD_GATEWAY,
            Outcome::ReplicaFailed,
            format!("{replica} failed while answering: {e}"),
        ),
    }
}

pub async fn forward(State(door): State<Arc<FrontDoor>>, req: Request) -> Response {
    door.forward(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_client_api_is_forwarded() {
        for path in [
            "/api/chat",
            "/v1/sessions/s-1/turns",
            "/v1/sessions/s-1",
            "/v1/sessions/s-1/files/notes.md",
            "/v1/sessions/a.b/files/.env",
            "/v1/sessions/a%5Cb",
            "/healthz",
            "/readyz",
        ] {
            assert!(client_route(path), "{path}");
        }
        for path in [
            "/v1/admin/drain",
            "/v1/admin/prestop",
            "/v1/admin/status",
            "/v1/admin/tenants/t/sessions/s/takeover",
            "/drained",
            "/metrics",
            "/",
            "/v1/sessions/../admin/drain",
            "/v1/sessions/%2e%2e/admin/drain",
            "/v1/sessions/%2E./admin/drain",
            "/v1/sessions/s/./x",
            "/v1/sessions\\..\\admin/drain",
            "/api/chat/",
        ] {
            assert!(!client_route(path), "{path}");
        }
    }
}
