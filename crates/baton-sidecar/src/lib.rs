//! `baton sidecar`: one per replica. It owns the turn protocol so the
//! agent next to it can be a plain function `(state, input, workspace) ->
//! (reply, new state, files)` in any language.
//!
//! - [`engine`]: one turn end to end (begin, workspace, agent, commit);
//! - [`http`]: the client, admin, probe and metrics API;
//! - [`inflight`]: running turns and the drain;
//! - [`config`]: the `BATON_*` settings the operator injects;
//! - [`runtimes`]: the runtime threads, sharing one listener.
#![forbid(unsafe_code)]

pub mod agent_client;
pub mod auth;
pub mod config;
pub mod engine;
pub mod follow;
pub mod http;
pub mod inflight;
pub mod live;
mod local_workspaces;
pub mod metrics;
pub mod outcome;
pub mod recorder;
mod retention;
mod runtimes;

use std::sync::Arc;

use anyhow::Context as _;
use baton_ledger::RedisLedgerStore;
use baton_session::WorkspaceRoots;
use baton_store_sqlite::SqliteStore;
use baton_workspace::WorkspaceStore;
use baton_workspace::collector::{Collector, CollectorSettings};

pub use config::SidecarArgs;

use crate::agent_client::AgentClient;
use crate::auth::Auth;
use crate::engine::{Engine, Timings};
use crate::http::Api;

/// Runs the sidecar until SIGTERM or Ctrl-C, then drains and exits. Call
/// it on a current-thread runtime: it starts the other runtime threads
/// itself (see [`runtimes`]).
pub async fn run(args: SidecarArgs) -> anyhow::Result<()> {
    args.check().map_err(anyhow::Error::msg)?;
    let workspaces = workspace_store(&args)?;
    match (&args.redis_url, &args.database_url) {
        (Some(redis), Some(database)) => {
            let store = RedisLedgerStore::connect_in(redis, database, &args.store_namespace)
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

fn workspace_store(args: &SidecarArgs) -> anyhow::Result<WorkspaceStore> {
    args.workspace
        .open(&args.store_namespace)
        .with_context(|| format!("workspace store ({})", args.workspace.describe()))
}

/// A store a runtime thread can get its own handle on.
trait ThreadStore:
    http::ApiStore + WorkspaceRoots + baton_session::LedgerRetention + Clone + Sized
{
    /// A handle whose I/O runs on the current runtime.
    async fn for_this_thread(&self, args: &SidecarArgs) -> anyhow::Result<Self>;

    /// Stops the store's background work (the ledger shipper), once no
    /// turn runs any more.
    async fn stop_background(&self) {}
}

impl ThreadStore for RedisLedgerStore {
    async fn for_this_thread(&self, args: &SidecarArgs) -> anyhow::Result<Self> {
        let url = args.redis_url.as_deref().context("no Redis URL")?;
        Ok(self.with_own_redis_connection(url).await?)
    }

    async fn stop_background(&self) {
        self.stop_shipping().await;
    }
}

impl ThreadStore for SqliteStore {
    async fn for_this_thread(&self, _: &SidecarArgs) -> anyhow::Result<Self> {
        // The same handle: sqlx runs SQLite on threads of its own, so there
        // is no socket to keep on this thread.
        Ok(self.clone())
    }
}

async fn serve<S: ThreadStore>(
    args: SidecarArgs,
    store: S,
    workspaces: WorkspaceStore,
) -> anyhow::Result<()> {
    let timings = Timings {
        lease_ttl: args.timing.lease_ttl,
        state_ttl: args.timing.state_ttl,
        renew_interval: args.renew_interval(),
        drain_timeout: args.timing.drain_timeout,
        heartbeat_interval: args.timing.heartbeat_interval,
        heartbeat_ttl: args.heartbeat_ttl(),
    };
    // Bound first (connections wait in the backlog until served): a port
    // in use fails the start, and a port the system picks is known before
    // the first heartbeat says it.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let admin_listener = match args.admin_listen {
        Some(at) => Some(
            tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("admin listen on {at}"))?,
        ),
        None => None,
    };
    let admin_addr = admin_listener
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;
    let advertised_url = if args.advertise_bound_address {
        Some(format!("http://{}", admin_addr.unwrap_or(addr)))
    } else {
        args.advertise_url.clone()
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
        .map_err(anyhow::Error::msg)?
        .with_local_budget(engine::LocalBudget {
            max_bytes: args.workspace_cache_mib.saturating_mul(1 << 20),
            ..engine::LocalBudget::default()
        })
        .with_advertised_url(advertised_url)
        .with_layout(args.data_layout, args.adopt_layout)
        .with_ledger_content(args.ledger_content),
    );
    let auth = Auth::parse(args.auth_tokens.as_deref(), args.admin_tokens.as_deref())
        .map_err(anyhow::Error::msg)?;
    if let Err(e) = engine.heartbeat().await {
        tracing::warn!(error = %e, "first heartbeat failed; not ready until the stores answer");
    }
    // The heartbeat gets a thread and a store connection of its own (see
    // `Engine::heartbeat_forever`). The ledger shipper stays on this one.
    let heart = (engine.clone(), args.clone());
    let _beating = runtimes::start("baton-heartbeat".into(), move || async move {
        let (engine, args) = heart;
        let store = engine.store.for_this_thread(&args).await?;
        Ok(async move {
            engine.heartbeat_forever(store).await;
            Ok(())
        })
    })
    .await
    .context("heartbeat thread")?;
    // One replica at a time deletes the workspace objects no session uses.
    if !args.workspace_gc_interval.is_zero() {
        let collector = Collector::new(
            engine.store.clone(),
            workspace_store(&args)?,
            engine.holder.to_string(),
            CollectorSettings {
                interval: args.workspace_gc_interval,
                retention: args.workspace_gc_retention,
            },
        );
        tokio::spawn(collector.run_forever());
    }

    if let Some(retention) = args.ledger_retention {
        tokio::spawn(retention::forget_forever(engine.store.clone(), retention));
    }

    let public = if admin_listener.is_some() {
        http::Routes::Public
    } else {
        http::Routes::All
    };
    let threads = runtimes::count(args.worker_threads);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (first_sender, own_lane) = runtimes::lane(addr);
    let mut lanes = vec![first_sender];
    let mut others = Vec::new();
    for n in 1..threads {
        let (sender, lane) = runtimes::lane(addr);
        lanes.push(sender);
        let (args, engine, auth, stopped) =
            (args.clone(), engine.clone(), auth.clone(), stopped.clone());
        let thread = runtimes::start(format!("baton-rt-{n}"), move || async move {
            let store = engine.store.for_this_thread(&args).await?;
            let sibling = engine.sibling(
                store,
                workspace_store(&args)?,
                AgentClient::new(&args.agent_url, args.agent_timeout),
            );
            Ok(runtimes::serve(
                lane,
                api(Arc::new(sibling), auth, &args),
                public,
                stopped,
            ))
        });
        others.push(
            thread
                .await
                .with_context(|| format!("runtime thread {n}"))?,
        );
    }
    tokio::spawn(runtimes::hand_out(listener, lanes, stopped.clone()));
    // Tests and `baton dev` read this line to learn the address.
    println!(
        "baton sidecar {} listening on http://{addr}",
        args.replica_id
    );
    if let (Some(admin_listener), Some(admin_addr)) = (admin_listener, admin_addr) {
        println!(
            "baton sidecar {} admin API on http://{admin_addr}",
            args.replica_id
        );
        let mut stop = stopped.clone();
        tokio::spawn(baton_serve::serve(
            baton_serve::no_delay(admin_listener),
            http::router(
                api(engine.clone(), auth.clone(), &args),
                http::Routes::Admin,
            ),
            baton_serve::Limits::DEFAULT,
            async move {
                let _ = stop.wait_for(|stop| *stop).await;
            },
        ));
    }
    tracing::info!(replica = %args.replica_id, holder = %engine.holder, %addr, threads, "sidecar started");
    let drained = engine.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutdown signal: draining");
        drained.start_drain("SIGTERM");
        drained.drained().await;
        stop.send_replace(true);
    });
    runtimes::serve(own_lane, api(engine.clone(), auth, &args), public, stopped).await?;
    for other in others {
        other.await?;
    }
    engine.store.stop_background().await;
    tracing::info!("sidecar stopped");
    Ok(())
}

fn api<S>(engine: Arc<Engine<S>>, auth: Auth, args: &SidecarArgs) -> Arc<Api<S>> {
    Arc::new(Api {
        engine,
        auth,
        max_body_bytes: args.max_body_bytes,
        max_input_bytes: args.max_input_bytes,
    })
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
