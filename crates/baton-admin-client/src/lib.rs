//! The one client of the sidecar's admin API (`/v1/admin/*`): the operator
//! (rolling releases), the dashboard (drain, takeover and stop buttons,
//! replica status) and `baton dev` (its rollout) all call a sidecar through here,
//! so the paths, the token, the actor header and what a refusal means are
//! written once.
//!
//! Which address may be called is the caller's business (the operator
//! calls pod IPs it read from the API; the dashboard calls only addresses
//! it can vouch for): this crate only makes the call.

use std::time::Duration;

use baton_api::constants::{headers, paths};
use baton_views::{Handover, Interrupted, ReplicaStatus, Takeover};
use serde::de::DeserializeOwned;

/// At most this much of a refusal's body is kept in the error.
const REFUSAL_CHARS: usize = 300;

/// Why a call to a sidecar's admin API failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The base URL is not an `http(s)` URL.
    #[error("{0:?} is not an http URL")]
    BadUrl(String),
    /// No answer within the call's time.
    #[error("timed out")]
    TimedOut,
    /// No connection (refused, unreachable, reset).
    #[error("connection refused or unreachable")]
    Unreachable,
    /// The connection failed in another way.
    #[error("the connection failed")]
    Failed,
    /// The sidecar answered with an error status; `reason` is its `error`
    /// field, or the start of its body.
    #[error("refused ({status}): {reason}")]
    Refused { status: u16, reason: String },
    /// The sidecar answered 2xx with a body that is not the expected one.
    #[error("answered something unexpected: {0}")]
    Unexpected(String),
}

impl AdminError {
    fn of(error: &reqwest::Error) -> Self {
        if error.is_timeout() {
            Self::TimedOut
        } else if error.is_connect() {
            Self::Unreachable
        } else {
            Self::Failed
        }
    }
}

/// The base URL of a sidecar's admin API at `ip:port` (an IPv6 address in
/// brackets).
pub fn base_url(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]:{port}")
    } else {
        format!("http://{ip}:{port}")
    }
}

/// One call's target and credentials.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The sidecar's admin base URL (`http://10.0.0.7:7071`).
    pub base: &'a str,
    /// The admin token, when the sidecar has one.
    pub token: Option<&'a str>,
    /// On whose behalf (the `x-baton-actor` header: the sidecar's log of a
    /// drain or takeover names it).
    pub actor: Option<&'a str>,
    /// How long the call may take.
    pub timeout: Duration,
}

/// The client; cheap to clone (one connection pool).
#[derive(Clone, Debug)]
pub struct AdminClient {
    http: reqwest::Client,
}

impl AdminClient {
    /// A client whose connections go idle after `pool_idle` (shorter than
    /// the servers' idle timeout, so a pooled connection is never one the
    /// server is closing).
    pub fn new(pool_idle: Duration) -> Self {
        Self {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(1))
                .pool_idle_timeout(pool_idle)
                .build()
                .expect("an HTTP client without TLS builds"),
        }
    }

    /// `GET /v1/admin/status`: draining, turns in flight, layouts.
    pub async fn status(&self, target: Target<'_>) -> Result<ReplicaStatus, AdminError> {
        self.call(target, reqwest::Method::GET, &[paths::STATUS], &[])
            .await
    }

    /// `POST /v1/admin/drain`: starts a drain and answers at once with the
    /// turns in flight; with `wait`, answers once the drain is over.
    pub async fn drain(&self, target: Target<'_>, wait: bool) -> Result<ReplicaStatus, AdminError> {
        let query: &[(&str, &str)] = if wait { &[("wait", "true")] } else { &[] };
        self.call(target, reqwest::Method::POST, &[paths::DRAIN], query)
            .await
    }

    /// `POST /v1/admin/handover`: a drained sidecar releases the leases it
    /// still holds.
    pub async fn handover(&self, target: Target<'_>) -> Result<Handover, AdminError> {
        self.call(target, reqwest::Method::POST, &[paths::HANDOVER], &[])
            .await
    }

    /// `POST /v1/admin/tenants/{tenant}/sessions/{session}/takeover`: the
    /// session's lease is taken from whoever holds it (each id is one
    /// path segment, encoded whatever it holds).
    pub async fn takeover(
        &self,
        target: Target<'_>,
        tenant: &str,
        session: &str,
    ) -> Result<Takeover, AdminError> {
        let segments = ["/v1/admin/tenants", tenant, "sessions", session, "takeover"];
        self.call(target, reqwest::Method::POST, &segments, &[])
            .await
    }

    /// `POST /v1/admin/tenants/{tenant}/sessions/{session}/interrupt`:
    /// stops the turn that runs on the session (only turn `turn_seq`, when
    /// given); refused with 404 when no such turn runs.
    pub async fn interrupt(
        &self,
        target: Target<'_>,
        tenant: &str,
        session: &str,
        turn_seq: Option<u64>,
    ) -> Result<Interrupted, AdminError> {
        let segments = [
            "/v1/admin/tenants",
            tenant,
            "sessions",
            session,
            "interrupt",
        ];
        let turn_seq = turn_seq.map(|n| n.to_string());
        let query: Vec<(&str, &str)> = turn_seq.iter().map(|n| ("turnSeq", n.as_str())).collect();
        self.call(target, reqwest::Method::POST, &segments, &query)
            .await
    }

    /// `segments[0]` is a path; the others are appended as single
    /// segments, percent-encoded.
    async fn call<T: DeserializeOwned>(
        &self,
        target: Target<'_>,
        method: reqwest::Method,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, AdminError> {
        let url = url(target.base, segments, query)?;
        let mut request = self.http.request(method, url).timeout(target.timeout);
        if let Some(token) = target.token {
            request = request.bearer_auth(token);
        }
        if let Some(actor) = target
            .actor
            .map(headers::actor_value)
            .and_then(|a| reqwest::header::HeaderValue::from_str(&a).ok())
        {
            request = request.header(headers::ACTOR, actor);
        }
        let answer = request.send().await.map_err(|e| AdminError::of(&e))?;
        let status = answer.status();
        let body = answer.bytes().await.map_err(|e| AdminError::of(&e))?;
        if !status.is_success() {
            return Err(AdminError::Refused {
                status: status.as_u16(),
                reason: refusal_reason(&body),
            });
        }
        serde_json::from_slice(&body).map_err(|e| AdminError::Unexpected(e.to_string()))
    }
}

fn url(base: &str, segments: &[&str], query: &[(&str, &str)]) -> Result<reqwest::Url, AdminError> {
    let bad = || AdminError::BadUrl(base.chars().take(200).collect());
    let (path, rest) = segments.split_first().expect("a path");
    let mut url =
        reqwest::Url::parse(&format!("{}{path}", base.trim_end_matches('/'))).map_err(|_| bad())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad());
    }
    if !rest.is_empty() {
        url.path_segments_mut().map_err(|_| bad())?.extend(rest);
    }
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    Ok(url)
}

/// The `error` field of a sidecar's JSON error, or the start of the body.
fn refusal_reason(body: &[u8]) -> String {
    let said = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(str::to_owned));
    let reason = said.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let reason = reason.trim();
    if reason.is_empty() {
        "no reason given".to_owned()
    } else {
        reason.chars().take(REFUSAL_CHARS).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_each_id_as_one_segment() {
        let url = url(
            "http://10.0.0.7:7071/",
            &[
                "/v1/admin/tenants",
                "a/b",
                "sessions",
                "s?x=1#f",
                "takeover",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            url.as_str(),
            "http://10.0.0.7:7071/v1/admin/tenants/a%2Fb/sessions/s%3Fx=1%23f/takeover"
        );
        let drain = super::url(
            "http://[fd00::7]:7071",
            &[paths::DRAIN],
            &[("wait", "true")],
        )
        .unwrap();
        assert_eq!(
            drain.as_str(),
            "http://[fd00::7]:7071/v1/admin/drain?wait=true"
        );
        assert_eq!(base_url("fd00::7", 7071), "http://[fd00::7]:7071");
        assert_eq!(base_url("10.0.0.7", 7071), "http://10.0.0.7:7071");
        for bad in ["file:///etc/passwd", "not a url", ""] {
            assert!(
                matches!(
                    super::url(bad, &[paths::STATUS], &[]),
                    Err(AdminError::BadUrl(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_refusal_says_the_sidecars_reason() {
        assert_eq!(
            refusal_reason(br#"{"error":"the admin token is wrong","outcome":"UNAUTHORIZED"}"#),
            "the admin token is wrong"
        );
        assert_eq!(refusal_reason(b"plain text"), "plain text");
        assert_eq!(refusal_reason(b""), "no reason given");
        assert_eq!(refusal_reason(&[b'x'; 5000]).len(), REFUSAL_CHARS);
    }
}
