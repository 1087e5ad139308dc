//! `baton dev`: the whole system on one machine. N replicas (each a
//! `baton sidecar` and a `baton agent` process, like the two containers of
//! a pod), a front door that round-robins across the ready ones like a
//! Kubernetes Service, and embedded stores (SQLite + a directory) unless
//! real Redis, Postgres and S3 are given.
#![forbid(unsafe_code)]

pub mod config;
pub mod front_door;
pub mod lock;
pub mod readiness;
pub mod replica;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;

use baton_sidecar::outcome::Outcome;
pub use config::{DevArgs, DevCommand};
use front_door::FrontDoor;
use readiness::{Probe, ProbeHistory, Readiness};
use replica::{Launcher, ReplicaSlot};

/// How often each replica's readiness is probed.
const PROBE_EVERY: Duration = Duration::from_millis(100);

struct Dev {
    door: Arc<FrontDoor>,
    /// Who may call `baton dev`'s own routes, and their audit log.
    dashboard: Arc<baton_web::server::Dashboard>,
    args: DevArgs,
    http: reqwest::Client,
    /// Drains a replica during `baton dev rollout`.
    admin: baton_admin_client::AdminClient,
    rolling: Arc<tokio::sync::Mutex<()>>,
}

/// One replica's replacement during a rollout.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStep {
    pub replica: String,
    pub drained_ms: u64,
    pub ready_ms: u64,
}

/// Runs `baton dev` (or its `rollout` subcommand) until Ctrl-C or SIGTERM.
pub async fn run(args: DevArgs, exe: PathBuf) -> anyhow::Result<()> {
    if let Some(DevCommand::Rollout { url, token_file }) = &args.command {
        return rollout_client(url, token_file.as_deref()).await;
    }
    args.check().map_err(anyhow::Error::msg)?;
    // A data directory in use is refused first (the message names the
    // running `baton dev`); a new one is created only once the front
    // door's port is ours, so a `baton dev` that cannot serve leaves no
    // empty store behind.
    let existing_lock = if args.data_dir.is_dir() {
        Some(lock::DataDirLock::take(&args.data_dir)?)
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| {
            format!(
                "front door on {} (another program holds it? choose another address with --listen)",
                args.listen
            )
        })?;
    let front = listener.local_addr()?;
    // Held until this function returns (or the process dies, any way).
    let _data_dir = match existing_lock {
        Some(lock) => lock,
        None => {
            std::fs::create_dir_all(&args.data_dir)
                .with_context(|| format!("data dir {}", args.data_dir.display()))?;
            lock::DataDirLock::take(&args.data_dir)?
        }
    };
    let embedded = args.redis_url.is_none();

    let mut slots = Vec::new();
    for i in 0..args.replicas {
        slots.push(Arc::new(ReplicaSlot::new(format!("replica-{i}"))));
    }
    // Before the replicas start: it migrates the embedded store once,
    // before several replica processes open it.
    let dashboard = dashboard(&args, &slots).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let launcher = Arc::new(Launcher {
        exe,
        args: args.clone(),
    });
    let mut supervisors = Vec::new();
    // A replica whose first processes never became ready stops everything.
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::channel(slots.len());
    for slot in &slots {
        let (slot2, launcher, stop) = (slot.clone(), launcher.clone(), stop_rx.clone());
        let fatal = fatal_tx.clone();
        supervisors.push(tokio::spawn(async move {
            if let Err(never_ready) = slot2.supervise(&launcher, stop).await {
                let _ = fatal.send(never_ready).await;
            }
        }));
        tokio::spawn(probe_forever(slot.clone(), stop_rx.clone()));
    }
    let dev = Arc::new(Dev {
        door: Arc::new(FrontDoor::new(slots.clone())),
        dashboard: dashboard.clone(),
        args: args.clone(),
        http: reqwest::Client::new(),
        admin: baton_admin_client::AdminClient::new(baton_serve::CLIENT_POOL_IDLE),
        rolling: Arc::new(tokio::sync::Mutex::new(())),
    });
    print_banner(&args, front, &slots, embedded);

    let app = Router::new()
        .route("/v1/dev/replicas", get(list_replicas))
        .route("/v1/dev/rollout", post(post_rollout))
        .method_not_allowed_fallback(baton_sidecar::http::method_not_allowed)
        .layer(axum::middleware::from_fn(
            baton_sidecar::http::json_refusals,
        ))
        .layer(axum::middleware::from_fn(baton_web::server::same_origin))
        .with_state(dev.clone())
        .merge(baton_web::server::router(dashboard.clone()))
        .fallback_service(
            Router::new()
                .fallback(front_door::forward)
                .with_state(dev.door.clone()),
        )
        // Open (no tokens file, loopback): every route answers loopback
        // names only, the turn API too (a rebound page could run turns).
        .layer(axum::middleware::from_fn_with_state(
            dashboard,
            baton_web::server::loopback_names_when_open,
        ));
    let announced = dev.clone();
    tokio::spawn(async move {
        if wait_all_ready(&announced.door.slots, Duration::from_secs(60)).await {
            println!(
                "baton dev: all {} replicas ready",
                announced.door.slots.len()
            );
        } else {
            eprintln!(
                "baton dev: replicas not ready after 60s; see the logs under {}",
                announced.args.data_dir.join("replicas").display()
            );
        }
    });
    let failed = Arc::new(std::sync::Mutex::new(None));
    let failing = failed.clone();
    baton_serve::serve(
        baton_web::server::no_delay(listener),
        app,
        baton_serve::Limits::DEFAULT,
        async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                Some(never_ready) = fatal_rx.recv() => {
                    *failing.lock().unwrap_or_else(|p| p.into_inner()) = Some(never_ready);
                }
            }
        },
    )
    .await;
    println!("baton dev: stopping");
    let _ = stop_tx.send(true);
    for s in supervisors {
        let _ = s.await;
    }
    let never_ready = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
    match never_ready {
        Some(never_ready) => Err(never_ready.into()),
        None => Ok(()),
    }
}

fn print_banner(args: &DevArgs, front: SocketAddr, slots: &[Arc<ReplicaSlot>], embedded: bool) {
    // Absolute: started from another directory, a relative path would look
    // like an empty store (every conversation lost) when it is another one.
    let data_dir = std::fs::canonicalize(&args.data_dir).unwrap_or_else(|_| args.data_dir.clone());
    let stores = if embedded {
        format!("embedded (SQLite {})", data_dir.join("baton.db").display())
    } else {
        "Redis + Postgres".to_owned()
    };
    let workspaces = match &args.s3.s3_endpoint {
        Some(e) => format!("S3 {e}/{}", args.s3.s3_bucket),
        None => format!("directory {}", data_dir.join("objects").display()),
    };
    println!(
        "baton dev: {} replicas; stores: {stores}; workspaces: {workspaces}",
        slots.len()
    );
    println!("  front door   http://{front}");
    for slot in slots {
        let s = slot.status();
        println!("  {:<12} {} (agent {})", slot.id, s.url, s.agent_url);
    }
    println!("  replicas     http://{front}/v1/dev/replicas");
    let access = if args.dashboard_tokens_file.is_some() {
        "sign in with a token of --dashboard-tokens-file"
    } else {
        "open on this machine, as an operator"
    };
    println!("  dashboard    http://{front}/dashboard ({access})");
    println!(
        "try: curl -s http://{front}/api/chat --json '{{\"sessionId\":\"s-1\",\"input\":\"my name is Lin\"}}'"
    );
}

/// The dashboard on the front door: over the same stores as the replicas,
/// its audit log in the data directory.
async fn dashboard(
    args: &DevArgs,
    slots: &[Arc<ReplicaSlot>],
) -> anyhow::Result<Arc<baton_web::server::Dashboard>> {
    let replicas = slots.to_vec();
    let replica_urls: Arc<dyn Fn() -> Vec<String> + Send + Sync> =
        Arc::new(move || replicas.iter().filter_map(|s| s.url()).collect());
    use baton_web::server::{Audit, Catalog, Dashboard, Sidecars, auth_for};
    let catalog: Arc<dyn Catalog> = match (&args.redis_url, &args.database_url) {
        (Some(redis), Some(database)) => Arc::new(
            baton_ledger::RedisCatalog::connect(redis, database)
                .await
                .context("the dashboard's Redis and Postgres")?,
        ),
        _ => {
            let db = args.data_dir.join("baton.db");
            Arc::new(
                baton_store_sqlite::SqliteStore::open(&db)
                    .await
                    .with_context(|| format!("embedded store {}", db.display()))?,
            )
        }
    };
    let workspaces = match args.s3.config() {
        Some(config) => baton_workspace::WorkspaceStore::s3(&config),
        None => baton_workspace::WorkspaceStore::local(&args.data_dir.join("objects")),
    }
    .context("the dashboard's workspace store")?;
    let dashboard = Arc::new(Dashboard::new(
        catalog,
        Some(workspaces),
        // The replicas' admin API is open: `baton dev` gives them no tokens.
        // Only its own replicas are called, whatever a heartbeat says.
        Sidecars::new(None, baton_web::server::Vouch::Urls(replica_urls)),
        auth_for(args.dashboard_tokens_file.as_deref(), args.listen).map_err(anyhow::Error::msg)?,
        Audit::at(args.data_dir.join("dashboard-audit.jsonl")).map_err(anyhow::Error::msg)?,
    ));
    dashboard.start_sampling();
    Ok(dashboard)
}

async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

/// Probes one replica's `/readyz` until shutdown.
async fn probe_forever(slot: Arc<ReplicaSlot>, stop: watch::Receiver<bool>) {
    let mut history = ProbeHistory::default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap_or_default();
    let mut tick = tokio::time::interval(PROBE_EVERY);
    while !*stop.borrow() {
        tick.tick().await;
        // Its processes say their address at every start.
        let probe = match slot.url() {
            None => Probe::Failed,
            Some(base) => ready_probe(&http, &base).await,
        };
        if let Some(Readiness { ready, draining }) = history.observe(probe) {
            slot.set_probe(ready, draining);
        }
    }
}

/// What the sidecar at `base` says of its readiness.
async fn ready_probe(http: &reqwest::Client, base: &str) -> Probe {
    let url = format!("{base}{}", baton_api::constants::paths::READYZ);
    match http.get(&url).send().await {
        Ok(r) if r.status().is_success() => Probe::Ready,
        Ok(r)
            if r.headers()
                .get("x-baton-outcome")
                .is_some_and(|v| v == "DRAINING") =>
        {
            Probe::Draining
        }
        Ok(_) | Err(_) => Probe::Failed,
    }
}

async fn wait_all_ready(slots: &[Arc<ReplicaSlot>], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if slots.iter().all(|s| s.status().ready) {
            return true;
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
    false
}

#[derive(serde::Deserialize)]
struct ReplicaFilter {
    /// Only the replica whose sidecar holds this session's lease.
    holding: Option<String>,
}

/// The replicas, or with `?holding=SESSION` the one holding that
/// session's lease (none when nobody holds it): the pid to kill in the
/// README's kill -9 step, in one request.
async fn list_replicas(
    State(dev): State<Arc<Dev>>,
    headers: axum::http::HeaderMap,
    axum::extract::Query(filter): axum::extract::Query<ReplicaFilter>,
) -> Response {
    // With a tokens file, reading needs a dashboard token (any role).
    if !dev.dashboard.auth.is_open() {
        match dev.dashboard.auth.bearer_viewer(&headers) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return refused(
                    StatusCode::UNAUTHORIZED,
                    Outcome::Unauthorized,
                    "send `Authorization: Bearer <token>` with a token of --dashboard-tokens-file"
                        .into(),
                );
            }
            Err(e) => return refused(StatusCode::UNAUTHORIZED, Outcome::Unauthorized, e),
        }
    }
    let all: Vec<replica::ReplicaStatus> = dev.door.slots.iter().map(|s| s.status()).collect();
    let Some(session) = filter.holding else {
        return Json(all).into_response();
    };
    let owner = match lease_owner(&dev, &all, &session).await {
        Ok(owner) => owner,
        Err((status, outcome, error)) => return refused(status, outcome, error),
    };
    // A holder is the replica's id plus a suffix per process start.
    let holding: Vec<_> = all
        .into_iter()
        .filter(|r| {
            owner.as_deref().is_some_and(|o| {
                o.strip_prefix(&r.id)
                    .is_some_and(|rest| rest.starts_with('-'))
            })
        })
        .collect();
    Json(holding).into_response()
}

/// The lease owner of `session` (default tenant), asked of a ready replica.
async fn lease_owner(
    dev: &Dev,
    replicas: &[replica::ReplicaStatus],
    session: &str,
) -> Result<Option<String>, (StatusCode, Outcome, String)> {
    let failed = |e: String| (StatusCode::BAD_GATEWAY, Outcome::ReplicaFailed, e);
    let replica = replicas.iter().find(|r| r.ready).ok_or_else(|| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::NoReplica,
            "no replica is ready; retry shortly".to_owned(),
        )
    })?;
    let mut url = reqwest::Url::parse(&replica.url).map_err(|e| failed(e.to_string()))?;
    url.path_segments_mut()
        .map_err(|()| failed("replica url".to_owned()))?
        .extend(["v1", "sessions", session]);
    let answer = dev
        .http
        .get(url)
        .send()
        .await
        .map_err(|e| failed(format!("{}: {e}", replica.id)))?;
    if answer.status() == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    let body: serde_json::Value = answer
        .json()
        .await
        .map_err(|e| failed(format!("{}: {e}", replica.id)))?;
    Ok(body["lease"]["owner"].as_str().map(String::from))
}

/// A refusal in the sidecar's error shape (body and outcome header).
fn refused(status: StatusCode, outcome: Outcome, error: String) -> Response {
    baton_sidecar::http::ApiError::new(status, outcome, error).into_response()
}

/// What the audit log names a rollout's target.
const EVERY_REPLICA: &str = "every replica";

/// Replaces every replica, as an operator: the dashboard's gate decides
/// who may (a token of the tokens file with the operator role, or on an
/// open loopback dashboard any local client that is not another site's
/// page), and the audit log records it, refused or done.
async fn post_rollout(State(dev): State<Arc<Dev>>, headers: axum::http::HeaderMap) -> Response {
    use baton_web::server::actions::{Proof, authorize};
    let viewer = match authorize(
        &dev.dashboard,
        &headers,
        Proof::Api,
        "rollout",
        EVERY_REPLICA,
    )
    .await
    {
        Ok(viewer) => viewer,
        Err(refusal) => return refusal,
    };
    let Ok(one_at_a_time) = dev.rolling.clone().try_lock_owned() else {
        let message = "a rollout is already running".to_owned();
        dev.dashboard
            .audit(&viewer.name, "rollout", EVERY_REPLICA, Err(message.clone()))
            .await;
        return refused(StatusCode::CONFLICT, Outcome::RolloutRunning, message);
    };
    // Its own task: a client that goes away must not leave a replica
    // drained and never replaced.
    let actor = viewer.name.clone();
    let running = dev.clone();
    let task = tokio::spawn(async move {
        let _held = one_at_a_time;
        rollout(&running, &actor).await
    });
    let outcome = task
        .await
        .unwrap_or_else(|e| Err(format!("the rollout task failed: {e}")));
    let audited = match &outcome {
        Ok(steps) => Ok(format!("replaced {} replica(s)", steps.len())),
        Err(e) => Err(e.clone()),
    };
    dev.dashboard
        .audit(&viewer.name, "rollout", EVERY_REPLICA, audited)
        .await;
    match outcome {
        Ok(steps) => Json(json!({ "status": "OK", "replaced": steps })).into_response(),
        Err(e) => refused(StatusCode::INTERNAL_SERVER_ERROR, Outcome::RolloutFailed, e),
    }
}

/// Replaces every replica, one at a time: drain (in-flight turns finish or
/// are handed over at the drain timeout), stop, start, wait until ready.
async fn rollout(dev: &Dev, actor: &str) -> Result<Vec<RolloutStep>, String> {
    let ready_timeout = Duration::from_secs(60);
    let mut steps = Vec::new();
    for slot in &dev.door.slots {
        let started = Instant::now();
        println!("baton dev rollout: draining {}", slot.id);
        // A replica that is down (no address, or no answer) needs no
        // drain; it is replaced anyway.
        if let Some(base) = slot.url() {
            let actor = format!("{actor} (baton dev rollout)");
            let target = baton_admin_client::Target {
                base: &base,
                // baton dev's sidecars keep their admin API on loopback,
                // with no token.
                token: None,
                actor: Some(&actor),
                timeout: dev.args.timing.drain_timeout + Duration::from_secs(15),
            };
            if let Err(e) = dev.admin.drain(target, true).await {
                eprintln!("baton dev rollout: drain of {} failed: {e}", slot.id);
            }
        }
        let drained_ms = started.elapsed().as_millis() as u64;
        let generation = slot.status().generation;
        slot.request_replace();
        let deadline = Instant::now() + ready_timeout;
        loop {
            let s = slot.status();
            if s.generation > generation && s.ready {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} was not ready {ready_timeout:?} after its replacement",
                    slot.id
                ));
            }
            tokio::time::sleep(PROBE_EVERY / 2).await;
        }
        let ready_ms = started.elapsed().as_millis() as u64;
        println!("baton dev rollout: {} replaced in {ready_ms} ms", slot.id);
        steps.push(RolloutStep {
            replica: slot.id.clone(),
            drained_ms,
            ready_ms,
        });
    }
    Ok(steps)
}

async fn rollout_client(url: &str, token_file: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut request =
        reqwest::Client::new().post(format!("{}/v1/dev/rollout", url.trim_end_matches('/')));
    if let Some(path) = token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("BATON_DASHBOARD_TOKEN_FILE {}", path.display()))?;
        request = request.bearer_auth(token.trim());
    }
    let answer = request
        .send()
        .await
        .with_context(|| format!("is `baton dev` running at {url}?"))?;
    let status = answer.status();
    let body: serde_json::Value = answer.json().await.context("rollout answer")?;
    if !status.is_success() {
        anyhow::bail!("rollout failed: {}", body["error"]);
    }
    for step in body["replaced"].as_array().into_iter().flatten() {
        println!(
            "{} drained in {} ms, ready again after {} ms",
            step["replica"].as_str().unwrap_or("?"),
            step["drainedMs"],
            step["readyMs"]
        );
    }
    println!("rollout complete");
    Ok(())
}
