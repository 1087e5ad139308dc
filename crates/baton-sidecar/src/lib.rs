//! `baton sidecar`: one per replica. It owns the turn protocol so the
//! agent next to it can be a plain function `(state, input, workspace) ->
//! (reply, new state, files)` in any language.
//!
//! - [`engine`]: one turn end to end (begin, workspace, agent, commit);
//! - [`http`]: the client, admin, probe and metrics API;
//! - [`inflight`]: running turns and the drain;
//! - [`config`]: the `BATON_*` settings the operator injects.
#![forbid(unsafe_code)]

pub mod agent_client;
pub mod auth;
pub mod config;
pub mod engine;
pub mod http;
pub mod inflight;
pub mod metrics;

use std::sync::Arc;

use anyhow::Context as _;
use baton_session::redis_ledger::RedisLedgerStore;
use baton_session::sqlite::SqliteStore;
use baton_session::workspace::{S3Config, WorkspaceStore};
use baton_session::{SessionCatalog, TurnStore};

pub use config::SidecarArgs;

use crate::agent_client::AgentClient;
use crate::auth::Auth;
use crate::engine::{Engine, Timings};
use crate::http::Api;

/// Runs the sidecar until SIGTERM or Ctrl-C, then drains and exits.
pub async fn run(args: SidecarArgs) -> anyhow::Result<()> {
    args.check().map_err(anyhow::Error::msg)?;
    let workspaces = match &args.s3_endpoint {
        Some(endpoint) => WorkspaceStore::s3(&S3Config {
            endpoint: endpoint.clone(),
            bucket: args.s3_bucket.clone(),
            region: args.s3_region.clone(),
            access_key_id: args.s3_access_key_id.clone(),
            secret_access_key: args.s3_secret_access_key.clone(),
            force_path_style: args.s3_force_path_style,
        })
        .context("workspace store (S3)")?,
        None => WorkspaceStore::local(&args.objects_dir).context("workspace store (directory)")?,
    };
    match (&args.redis_url, &args.database_url) {
        (Some(redis), Some(database)) => {
            let store = RedisLedgerStore::connect(redis, database)
                .await
                .context("Redis + Postgres")?;
            serve(args, store, workspaces).await
        }
        _ => {
            if let Some(parent) = args.sqlite_path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let store = SqliteStore::open(&args.sqlite_path)
                .await
                .with_context(|| format!("SQLite store {}", args.sqlite_path.display()))?;
            serve(args, store, workspaces).await
        }
    }
}

async fn serve<S: TurnStore + SessionCatalog + 'static>(
    args: SidecarArgs,
    store: S,
    workspaces: WorkspaceStore,
) -> anyhow::Result<()> {
    let timings = Timings {
        lease_ttl: args.lease_ttl,
        state_ttl: args.state_ttl,
        renew_interval: args.renew_interval(),
        drain_timeout: args.drain_timeout,
        heartbeat_interval: args.heartbeat_interval,
        heartbeat_ttl: args.heartbeat_ttl(),
    };
    std::fs::create_dir_all(&args.workspace_dir)
        .with_context(|| format!("workspace dir {}", args.workspace_dir.display()))?;
    // Absolute, so agents get absolute workspace paths.
    let workspace_root = args.workspace_dir.canonicalize()?;
    let engine = Arc::new(
        Engine::new(
            store,
            workspaces,
            AgentClient::new(&args.agent_url, args.agent_timeout),
            &args.replica_id,
            timings,
            workspace_root,
        )
        .map_err(anyhow::Error::msg)?,
    );
    if let Err(e) = engine.heartbeat().await {
        tracing::warn!(error = %e, "first heartbeat failed; not ready until the stores answer");
    }
    tokio::spawn(engine.clone().heartbeat_forever());
    let api = Arc::new(Api {
        engine: engine.clone(),
        auth: Auth::parse(args.auth_tokens.as_deref(), args.admin_tokens.as_deref())
            .map_err(anyhow::Error::msg)?,
        max_body_bytes: args.max_body_bytes,
        max_input_bytes: args.max_input_bytes,
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Tests and `baton dev` read this line to learn the address.
    println!(
        "baton sidecar {} listening on http://{addr}",
        args.replica_id
    );
    tracing::info!(replica = %args.replica_id, holder = %engine.holder, %addr, "sidecar started");
    let drained = engine.clone();
    axum::serve(listener, http::router(api))
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            tracing::info!("shutdown signal: draining");
            drained.start_drain();
            drained.drained().await;
        })
        .await?;
    tracing::info!("sidecar stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
