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

/// Largest request body the front door passes on (the sidecar has its own,
/// smaller limit and answers 413 with its message).
pub const MAX_FORWARD_BYTES: usize = 64 * 1024 * 1024;

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
        let (parts, body) = req.into_parts();
        let body = match axum::body::to_bytes(body, MAX_FORWARD_BYTES).await {
            Ok(b) => b,
            Err(e) => {
                return refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Outcome::TooLarge,
                    format!(
                        "request body: {e} (the front door passes at most {MAX_FORWARD_BYTES} bytes)"
                    ),
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
            let mut outgoing = self
                .http
                .request(parts.method.clone(), format!("{}{path}", slot.url()))
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
