//! Calls the user's agent container through the agent contract.

use std::time::Duration;

use baton_api::agent_contract::{TURN_PATH, TurnRequest, TurnResponse};
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

#[derive(Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    /// Parsed once: parsing (with IDNA) on every turn showed in profiles.
    url: Result<reqwest::Url, String>,
    /// `host:port` of the agent, for the readiness check.
    address: Option<String>,
    timeout: Duration,
}

/// Longest part of an agent's error body quoted back to the client.
const QUOTED_BODY_CHARS: usize = 512;

impl AgentClient {
    pub fn new(base_url: &str, timeout: Duration) -> Self {
        let address = reqwest::Url::parse(base_url)
            .ok()
            .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)));
        Self {
            // The agent contract has no redirects; following none also keeps
            // the redirect policy off every turn's profile.
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            url: reqwest::Url::parse(&format!("{}{TURN_PATH}", base_url.trim_end_matches('/')))
                .map_err(|e| format!("agent URL {base_url:?}: {e}")),
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
    pub async fn turn(
        &self,
        req: &TurnRequest<&RawValue>,
    ) -> Result<TurnResponse<Box<RawValue>>, AgentCallError> {
        let url = self.url.clone().map_err(AgentCallError::Unreachable)?;
        let sent = self
            .http
            .post(url)
            .json(req)
            .timeout(self.timeout)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Err(AgentCallError::Timeout(self.timeout)),
            Err(e) if e.is_connect() => return Err(AgentCallError::Unreachable(e.to_string())),
            Err(e) => return Err(AgentCallError::Broken(e.to_string())),
        };
        let status = response.status();
        let body = match response.bytes().await {
            Ok(b) => b,
            Err(e) if e.is_timeout() => return Err(AgentCallError::Timeout(self.timeout)),
            Err(e) => return Err(AgentCallError::Broken(e.to_string())),
        };
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
