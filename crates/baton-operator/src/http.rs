//! `/healthz`, `/readyz` and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// What the probes report.
#[derive(Default)]
pub struct Health {
    /// The API server answered and leader election runs (a standby is ready too).
    pub ready: AtomicBool,
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(state): State<AppState>| async move {
                if state.health.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(state): State<AppState>| async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    state.metrics.encode(),
                )
            }),
        )
        .with_state(AppState { health, metrics });
    baton_serve::serve(
        listener,
        app,
        baton_serve::Limits::DEFAULT,
        std::future::pending(),
    )
    .await;
    Ok(())
}

pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context;
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} (--metrics-listen)"))
}
