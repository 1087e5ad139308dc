//! Calls to the replicas' sidecars, at the URL each advertises with its
//! heartbeat: their status (in-flight turns), drain and takeover, with the
//! admin token the sidecars were given. Every failure is a sentence naming
//! the replica and what went wrong.

use std::time::Duration;

use baton_views::{ReplicaStatus, ReplicaView, Takeover};
use serde::de::DeserializeOwned;

/// How long a sidecar gets to answer a page's question.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// Takeover and drain answer at once (drain does not wait here); a
/// replica that takes longer is likely stuck, and the next one is tried.
const ACTION_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
pub struct Sidecars {
    http: reqwest::Client,
    admin_token: Option<String>,
}

impl Sidecars {
    pub fn new(admin_token: Option<String>) -> Self {
        Self {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(1))
                .build()
                .unwrap_or_default(),
            admin_token: admin_token.filter(|t| !t.is_empty()),
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        replica: &ReplicaView,
        method: reqwest::Method,
        path: &str,
        timeout: Duration,
        actor: Option<&str>,
    ) -> Result<T, String> {
        let name = &replica.info.replica;
        let Some(base) = replica.info.url.as_deref() else {
            return Err(format!(
                "{name} does not advertise its address (its sidecar needs --advertise-url)"
            ));
        };
        let mut request = self
            .http
            .request(method, format!("{}{path}", base.trim_end_matches('/')))
            .timeout(timeout);
        if let Some(token) = &self.admin_token {
            request = request.bearer_auth(token);
        }
        // The sidecar logs whom a drain or takeover was for.
        if let Some(actor) = actor
            .map(|a| baton_api::constants::headers::actor_value(&format!("{a} (dashboard)")))
            .and_then(|a| reqwest::header::HeaderValue::from_str(&a).ok())
        {
            request = request.header(baton_api::constants::headers::ACTOR, actor);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| format!("{name} did not answer: {}", reason(&e)))?;
        let status = answer.status();
        if !status.is_success() {
            let body: serde_json::Value = answer.json().await.unwrap_or_default();
            let said = body["error"].as_str().unwrap_or("no reason given");
            return Err(format!("{name} refused ({status}): {said}"));
        }
        answer
            .json()
            .await
            .map_err(|e| format!("{name} answered something unexpected: {e}"))
    }

    pub async fn status(&self, replica: &ReplicaView) -> Result<ReplicaStatus, String> {
        self.call(
            replica,
            reqwest::Method::GET,
            "/v1/admin/status",
            STATUS_TIMEOUT,
            None,
        )
        .await
    }

    /// Starts draining (the sidecar answers at once; the page follows it).
    pub async fn drain(&self, replica: &ReplicaView, actor: &str) -> Result<ReplicaStatus, String> {
        self.call(
            replica,
            reqwest::Method::POST,
            "/v1/admin/drain",
            ACTION_TIMEOUT,
            Some(actor),
        )
        .await
    }

    pub async fn takeover(
        &self,
        via: &ReplicaView,
        tenant: &str,
        session: &str,
        actor: &str,
    ) -> Result<Takeover, String> {
        let path = format!(
            "/v1/admin/tenants/{}/sessions/{}/takeover",
            crate::format::url_encode(tenant),
            crate::format::url_encode(session)
        );
        self.call(
            via,
            reqwest::Method::POST,
            &path,
            ACTION_TIMEOUT,
            Some(actor),
        )
        .await
    }
}

/// What went wrong with a request, without the URL reqwest puts first.
fn reason(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection refused or unreachable"
    } else {
        "the connection failed"
    }
}
