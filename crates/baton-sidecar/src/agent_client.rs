//! Calls the user's agent container through the agent contract.
//!
//! The agent runs in the same pod, so this is plain HTTP/1.1 on hyper's
//! pooled client, without a general-purpose client's layers (redirects,
//! proxies, URL re-parsing): those showed as a fifth of the sidecar's
//! instructions per turn in callgrind (see BENCHMARKS.md).

use std::time::Duration;

use baton_api::agent_contract::{TURN_PATH, TurnRequest, TurnResponse};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
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
}

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
    /// The timeout covers the whole exchange, the reply's body included.
    pub async fn turn(
        &self,
        req: &TurnRequest<&RawValue>,
    ) -> Result<TurnResponse<Box<RawValue>>, AgentCallError> {
        let uri = self.uri.clone().map_err(AgentCallError::Unreachable)?;
        let body = serde_json::to_vec(req).map_err(|e| AgentCallError::Broken(e.to_string()))?;
        let request = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
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
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| AgentCallError::Broken(error_chain(e)))?
                .to_bytes();
            Ok::<_, AgentCallError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| AgentCallError::Timeout(self.timeout))??;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(AgentCallError::Failed {
                status: status.as_u16(),
                body: text.chars().take(QUOTED_BODY_CHARS).collect(),
            });
        }
        serde_json::from_slice(&body).map_err(|e| AgentCallError::Malformed(e.to_string()))
    }
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
