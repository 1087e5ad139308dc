//! Calls the user's agent container through the agent contract.
//!
//! The agent runs in the same pod, so this is plain HTTP/1.1 on hyper's
//! pooled client, without a general-purpose client's layers (redirects,
//! proxies, URL re-parsing): those showed as a fifth of the sidecar's
//! instructions per turn in callgrind (see BENCHMARKS.md).
//!
//! The agent answers JSON (contract version 1) or streams Server-Sent
//! Events (version 2, see [`baton_api::agent_contract::stream`]): each
//! delta and progress event goes to the caller's sink as it arrives; the
//! `final` event is the answer.

use std::time::Duration;

use baton_api::agent_contract::{TURN_PATH, TurnRequest, TurnResponse, stream};
use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use http_body_util::{BodyDataStream, BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use serde_json::value::RawValue;

#[derive(Debug, thiserror::Error)]
pub enum AgentCallError {
    #[error("the agent did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection was refused: the agent never saw the turn.
    #[error("the agent is unreachable: {0}")]
    Unreachable(String),
    /// The connection broke after the request was sent: it may have run.
    #[error("the agent's connection broke: {0}")]
    Broken(String),
    #[error("the agent answered {status}: {body}")]
    Failed { status: u16, body: String },
    #[error("the agent's answer is not the contract's {{reply, state}}: {0}")]
    Malformed(String),
    /// The agent's stream carried an `error` event.
    #[error("the agent reported an error: {0}")]
    Reported(String),
}

/// What an agent streams while it works (contract version 2): provisional
/// until the turn commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentEvent {
    /// The next piece of the reply.
    Delta(String),
    /// A progress event's JSON object, as the agent sent it.
    Progress(String),
}

/// Longest stream an agent may send for one turn: room for the final
/// event's reply and state at their limits and for the deltas that spelt
/// the reply out.
pub const MAX_STREAM_BYTES: usize = 16 * 1024 * 1024;

/// The agent's turn endpoint for a base URL such as `http://127.0.0.1:8000`:
/// plain `http` with a host (the agent shares the pod's loopback; TLS there
/// would protect nothing).
pub fn turn_uri(base_url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = format!("{}{TURN_PATH}", base_url.trim_end_matches('/'))
        .parse()
        .map_err(|e| format!("{base_url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{base_url:?} must start with http:// (the agent is reached in the pod, without TLS)"
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{base_url:?} has no host"));
    }
    Ok(uri)
}

#[derive(Clone)]
pub struct AgentClient {
    http: Client<HttpConnector, Full<Bytes>>,
    /// Parsed once, when the sidecar starts.
    uri: Result<http::Uri, String>,
    /// `host:port` of the agent, for the readiness check.
    address: Option<String>,
    timeout: Duration,
}

/// Longest part of an agent's error body quoted back to the client.
const QUOTED_BODY_CHARS: usize = 512;

impl AgentClient {
    pub fn new(base_url: &str, timeout: Duration) -> Self {
        let uri = turn_uri(base_url).map_err(|e| format!("agent URL {e}"));
        let address = uri.as_ref().ok().and_then(|u| {
            let host = u.host()?.trim_start_matches('[').trim_end_matches(']');
            let port = u.port_u16().unwrap_or(80);
            Some(if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            })
        });
        let mut connector = HttpConnector::new();
        // Requests and replies are small and answered at once: Nagle's
        // algorithm would only hold them back.
        connector.set_nodelay(true);
        Self {
            // Idle connections go before the agent's server closes them (a
            // turn sent into a closing connection would fail as if the
            // agent had died during it).
            http: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(baton_serve::CLIENT_POOL_IDLE)
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build(connector),
            uri,
            address,
            timeout,
        }
    }

    /// Whether the agent accepts connections (its container may start after
    /// the sidecar, or restart): a replica is not ready without it.
    pub async fn reachable(&self) -> bool {
        let Some(address) = &self.address else {
            return false;
        };
        let connect = tokio::net::TcpStream::connect(address.as_str());
        matches!(
            tokio::time::timeout(Duration::from_millis(500), connect).await,
            Ok(Ok(_))
        )
    }

    /// One agent call; the state goes out and comes back as raw JSON text.
    /// A streaming agent's deltas and progress events go to `sink` as they
    /// arrive. The timeout covers the whole exchange, the reply's body (or
    /// the whole stream) included.
    pub async fn turn(
        &self,
        req: &TurnRequest<&RawValue>,
        sink: &(dyn Fn(AgentEvent) + Sync),
    ) -> Result<TurnResponse<Box<RawValue>>, AgentCallError> {
        let uri = self.uri.clone().map_err(AgentCallError::Unreachable)?;
        let body = serde_json::to_vec(req).map_err(|e| AgentCallError::Broken(e.to_string()))?;
        let request = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, stream::ACCEPT)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| AgentCallError::Unreachable(e.to_string()))?;
        let exchange = async {
            let response = self.http.request(request).await.map_err(|e| {
                if e.is_connect() {
                    AgentCallError::Unreachable(error_chain(e))
                } else {
                    AgentCallError::Broken(error_chain(e))
                }
            })?;
            let status = response.status();
            let streamed = status.is_success()
                && response
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with(stream::CONTENT_TYPE));
            if streamed {
                return read_stream(response.into_body(), sink).await;
            }
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| AgentCallError::Broken(error_chain(e)))?
                .to_bytes();
            if !status.is_success() {
                let text = String::from_utf8_lossy(&body);
                return Err(AgentCallError::Failed {
                    status: status.as_u16(),
                    body: text.chars().take(QUOTED_BODY_CHARS).collect(),
                });
            }
            serde_json::from_slice(&body).map_err(|e| AgentCallError::Malformed(e.to_string()))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| AgentCallError::Timeout(self.timeout))?
    }
}

/// Reads a version 2 answer: deltas and progress to `sink`, up to the
/// `final` event, which is the answer. Anything else fails the turn.
async fn read_stream(
    body: hyper::body::Incoming,
    sink: &(dyn Fn(AgentEvent) + Sync),
) -> Result<TurnResponse<Box<RawValue>>, AgentCallError> {
    let mut seen = 0usize;
    let bytes = BodyDataStream::new(body).map(move |chunk| {
        let chunk = chunk.map_err(|e| AgentCallError::Broken(error_chain(e)))?;
        seen += chunk.len();
        if seen > MAX_STREAM_BYTES {
            return Err(AgentCallError::Malformed(format!(
                "the stream is longer than {MAX_STREAM_BYTES} bytes"
            )));
        }
        Ok(chunk)
    });
    let mut events = std::pin::pin!(bytes.eventsource());
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| match e {
            EventStreamError::Transport(e) => e,
            other => AgentCallError::Malformed(format!("the event stream: {other}")),
        })?;
        let malformed = |what: &str, e: serde_json::Error| {
            AgentCallError::Malformed(format!("the data of a {what} event: {e}"))
        };
        match event.event.as_str() {
            stream::DELTA => {
                let delta: stream::Delta =
                    serde_json::from_str(&event.data).map_err(|e| malformed(stream::DELTA, e))?;
                sink(AgentEvent::Delta(delta.text));
            }
            stream::PROGRESS => {
                check_progress(&event.data)?;
                sink(AgentEvent::Progress(event.data));
            }
            stream::FINAL => {
                return serde_json::from_str(&event.data).map_err(|e| malformed(stream::FINAL, e));
            }
            stream::ERROR => {
                let message = serde_json::from_str::<stream::AgentError>(&event.data)
                    .map(|e| e.message)
                    .unwrap_or(event.data);
                return Err(AgentCallError::Reported(
                    message.chars().take(QUOTED_BODY_CHARS).collect(),
                ));
            }
            other => {
                return Err(AgentCallError::Malformed(format!(
                    "event {:?} is not one of delta, progress, final, error",
                    other.chars().take(64).collect::<String>()
                )));
            }
        }
    }
    Err(AgentCallError::Malformed(
        "the stream ended without a final event".into(),
    ))
}

/// A progress event is a JSON object with a short `name`.
fn check_progress(data: &str) -> Result<(), AgentCallError> {
    #[derive(serde::Deserialize)]
    struct Named {
        name: String,
    }
    let named: Named = serde_json::from_str(data).map_err(|e| {
        AgentCallError::Malformed(format!(
            "the data of a progress event must be an object with a name: {e}"
        ))
    })?;
    if named.name.is_empty() || named.name.len() > stream::MAX_PROGRESS_NAME_BYTES {
        return Err(AgentCallError::Malformed(format!(
            "a progress event's name must be 1 to {} bytes",
            stream::MAX_PROGRESS_NAME_BYTES
        )));
    }
    Ok(())
}

/// hyper's errors say "client error (Connect)" and keep the cause (such as
/// "Connection refused") in their source: `{:#}` prints both.
fn error_chain(e: impl std::error::Error + Send + Sync + 'static) -> String {
    format!("{:#}", anyhow::Error::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_uri_takes_plain_http_with_a_host() {
        assert_eq!(
            turn_uri("http://127.0.0.1:8000/").unwrap().to_string(),
            format!("http://127.0.0.1:8000{TURN_PATH}")
        );
        for bad in [
            "https://agent:8000",
            "agent:8000",
            "http://",
            "not a url",
            "",
        ] {
            assert!(turn_uri(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_readiness_address_has_the_default_port_and_brackets_ipv6() {
        let client = AgentClient::new("http://[::1]:9000", Duration::from_secs(1));
        assert_eq!(client.address.as_deref(), Some("[::1]:9000"));
        let client = AgentClient::new("http://agent", Duration::from_secs(1));
        assert_eq!(client.address.as_deref(), Some("agent:80"));
    }
}
