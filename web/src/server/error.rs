//! What can go wrong while the dashboard serves a page, a live update or
//! an action, as one type: each variant says what failed, and this module
//! is the one place that turns it into the page's words (its `Display`)
//! and, for the API routes, into a status and an outcome.
//!
//! The words never hold a store URL or a password: a store failure names
//! what was being read and the kind of error (the log has the detail).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::server::sidecars::SidecarError;

/// The message of a dashboard started without any deployment's stores.
pub const NO_STORES: &str = "this dashboard reads no deployment's stores: start it with --redis-url and --database-url of one AgentDeployment (the Helm chart: dashboard.agentDeployment) to see its sessions";

#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// The viewer may not do this (not signed in, no operator role, a
    /// form without this sign-in's CSRF token); audited as such.
    #[error("refused: {0}")]
    Refused(String),
    /// A value from the page breaks a rule; the message names the field.
    #[error("{0}")]
    Input(String),
    /// Nothing of that name (a replica, a session's file).
    #[error("{0}")]
    NotFound(String),
    /// A store read failed: what was being read, and the kind of error.
    #[error("{what} failed: the store answered {kind}")]
    Store {
        what: &'static str,
        kind: &'static str,
    },
    /// This dashboard reads no deployment's stores.
    #[error("{NO_STORES}")]
    NoStores,
    /// The workspace store is not configured, or did not answer.
    #[error("{0}")]
    Workspace(&'static str),
    /// One sidecar was not called, or did not do what was asked.
    #[error(transparent)]
    Sidecar(#[from] SidecarError),
    /// Every sidecar tried refused or did not answer (a takeover tries
    /// each live replica in turn).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Sidecars(Vec<SidecarError>),
    /// No live replica advertises an address to call.
    #[error("no live replica advertises its address, so none can take the session over")]
    NoReplicaToCall,
}

impl PageError {
    /// The HTTP status and outcome an API route answers it with.
    pub fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Refused(_) => (StatusCode::FORBIDDEN, "FORBIDDEN"),
            Self::Input(_) => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            Self::Store { .. }
            | Self::Workspace(_)
            | Self::Sidecar(_)
            | Self::Sidecars(_)
            | Self::NoReplicaToCall => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
            Self::NoStores => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, outcome) = self.status();
        refuse(status, outcome, self.to_string())
    }
}

/// A refusal in the JSON shape every Baton API answers: `{status, error}`
/// with the outcome also in `x-baton-outcome`.
pub(crate) fn refuse(status: StatusCode, outcome: &'static str, error: String) -> Response {
    let mut response = (
        status,
        axum::Json(json!({ "status": outcome, "error": error })),
    )
        .into_response();
    response
        .headers_mut()
        .insert("x-baton-outcome", HeaderValue::from_static(outcome));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_says_what_failed_and_answers_a_status() {
        let store = PageError::Store {
            what: "listing sessions",
            kind: "unavailable",
        };
        assert_eq!(
            store.to_string(),
            "listing sessions failed: the store answered unavailable"
        );
        assert_eq!(store.status().0, StatusCode::SERVICE_UNAVAILABLE);
        let input = PageError::Input("tenant: must not be empty".into());
        assert_eq!(input.status(), (StatusCode::BAD_REQUEST, "BAD_REQUEST"));
        let both = PageError::Sidecars(vec![
            SidecarError::NoAddress {
                replica: "r-0".into(),
            },
            SidecarError::NoAddress {
                replica: "r-1".into(),
            },
        ]);
        assert_eq!(
            both.to_string(),
            "r-0 does not advertise its address (its sidecar needs --advertise-url); r-1 does not advertise its address (its sidecar needs --advertise-url)"
        );
    }
}
