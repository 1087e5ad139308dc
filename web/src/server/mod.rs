//! The server half: what the dashboard reads and calls ([`Dashboard`]),
//! the axum router that renders the pages, answers the server functions,
//! streams live updates, runs the actions and serves the browser bundle,
//! and `baton dashboard` ([`run`]).

pub mod actions;
pub mod audit;
pub mod auth;
pub mod catalog;
pub mod cluster;
pub mod data;
pub mod error;
pub mod live;
pub mod output;
pub mod samples;
pub mod sidecars;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use baton_workspace::WorkspaceStore;
use leptos::prelude::*;
use leptos_axum::{LeptosRoutes, generate_route_list};

pub use audit::Audit;
pub use auth::Auth;
pub use catalog::Catalog;
pub use sidecars::{Sidecars, Vouch};

use crate::{App, shell};

/// Sessions a page of the dashboard shows at once.
pub const PAGE_SIZE: u32 = 100;
/// Turns the session page lists, newest first.
pub const TURN_HISTORY: u32 = 200;

/// The browser bundle `web/build.rs` built, embedded.
pub mod assets {
    include!(concat!(env!("OUT_DIR"), "/assets.rs"));
}

pub use baton_session::turn_record::now_ms;

/// Everything the pages read and the actions call.
pub struct Dashboard {
    pub catalog: Arc<dyn Catalog>,
    /// Where the sessions' workspace files are; `None`: not shown.
    pub workspaces: Option<WorkspaceStore>,
    pub sidecars: Sidecars,
    pub auth: Auth,
    pub audit: Audit,
    /// The replicas' recent turn counts (see [`samples::sample_forever`]).
    pub samples: samples::Samples,
    /// Reads shared by the open pages' live updates.
    pub live_pages: live::SharedReads,
    /// Kubernetes access, when given (`--kubernetes`).
    pub cluster: Option<cluster::Cluster>,
}

impl Dashboard {
    pub fn new(
        catalog: Arc<dyn Catalog>,
        workspaces: Option<WorkspaceStore>,
        sidecars: Sidecars,
        auth: Auth,
        audit: Audit,
    ) -> Self {
        Self {
            catalog,
            workspaces,
            sidecars,
            auth,
            audit,
            samples: samples::Samples::default(),
            live_pages: live::SharedReads::default(),
            cluster: None,
        }
    }

    /// Adds the cluster view and the audit events.
    pub fn with_cluster(mut self, cluster: cluster::Cluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Records an action in the audit log (and, in a cluster, as an event).
    pub async fn audit(
        &self,
        who: &str,
        action: &str,
        target: &str,
        outcome: Result<String, impl std::fmt::Display>,
    ) -> crate::model::AuditEntry {
        // The audit log keeps the words of a failure (a PageError's are the
        // page's).
        let outcome = outcome.map_err(|e| e.to_string());
        let entry = self.audit.record(who, action, target, outcome);
        if let Some(cluster) = &self.cluster {
            cluster.record(&entry).await;
        }
        entry
    }

    /// Starts sampling the replicas in the background (their plots).
    pub fn start_sampling(self: &Arc<Self>) {
        tokio::spawn(samples::sample_forever(self.clone()));
    }
}

/// The dashboard as the server functions find it in their context.
pub fn dashboard() -> Result<Arc<Dashboard>, ServerFnError> {
    use_context::<Arc<Dashboard>>().ok_or_else(|| ServerFnError::new("the dashboard has no store"))
}

/// The signed-in viewer of the request being served (the auth
/// middleware put it there).
pub async fn viewer() -> Result<crate::model::Viewer, ServerFnError> {
    let parts: axum::http::request::Parts = leptos_axum::extract().await?;
    parts
        .extensions
        .get::<crate::model::Viewer>()
        .cloned()
        .ok_or_else(|| ServerFnError::new("sign in first"))
}

/// The dashboard's routes, generated once per process. Generating them
/// runs the app with resource loading suppressed process-wide (a global
/// flag in leptos_server): a page whose resources first load on another
/// thread meanwhile waits forever (leptos-rs/leptos#4773). A process that
/// builds several routers (the tests: one per dashboard) must not do it
/// twice.
fn route_list() -> Vec<leptos_axum::AxumRouteListing> {
    static ROUTES: std::sync::OnceLock<Vec<leptos_axum::AxumRouteListing>> =
        std::sync::OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(App)).clone()
}

/// Every path of the dashboard, under `/dashboard`, so it can share a
/// listener with other routes (`baton dev`'s front door).
pub fn router(dashboard: Arc<Dashboard>) -> axum::Router {
    let options = LeptosOptions::builder()
        .output_name("baton-web")
        .site_pkg_dir("dashboard/pkg")
        .build();
    let routes = route_list();
    let context = dashboard.clone();
    let pages = axum::Router::new()
        .leptos_routes_with_context(
            &options,
            routes,
            move || provide_context(context.clone()),
            {
                let options = options.clone();
                move || shell(options.clone())
            },
        )
        .with_state(options);
    let rest = axum::Router::new()
        .route("/dashboard/signin", post(actions::sign_in))
        .route("/dashboard/signout", post(actions::sign_out))
        .route("/dashboard/actions/drain", post(actions::drain))
        .route("/dashboard/actions/takeover", post(actions::takeover))
        .route("/dashboard/actions/interrupt", post(actions::interrupt))
        .route(
            "/dashboard/files/{tenant}/{session}/{*name}",
            get(actions::file),
        )
        .route("/dashboard/live/sessions", get(live::sessions))
        .route(
            "/dashboard/live/sessions/{tenant}/{session}",
            get(live::session),
        )
        .route(
            "/dashboard/live/sessions/{tenant}/{session}/output",
            get(live::output),
        )
        .route("/dashboard/live/replicas", get(live::replicas))
        .with_state(dashboard.clone());
    axum::Router::new()
        .route("/dashboard/pkg/{file}", get(asset))
        .merge(pages)
        .merge(rest)
        .layer(middleware::from_fn(bounded_body))
        .layer(middleware::from_fn_with_state(dashboard.clone(), signed_in))
        .layer(middleware::from_fn(same_origin))
        .layer(middleware::from_fn_with_state(
            dashboard,
            loopback_names_when_open,
        ))
        .layer(middleware::from_fn(page_headers))
}

/// Largest request body the dashboard reads (its forms and server
/// functions send a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Reads a request's body (after the sign-in check, which runs first)
/// within [`MAX_BODY_BYTES`] and [`baton_serve::BODY_READ_TIMEOUT`]: a
/// body sent a byte at a time holds no handler.
async fn bounded_body(request: Request, next: Next) -> Response {
    let refuse = error::refuse;
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "TOO_LARGE",
            format!("request body: the limit is {MAX_BODY_BYTES} bytes"),
        );
    }
    if matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    ) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let deadline = baton_serve::BODY_READ_TIMEOUT;
    let bytes =
        match tokio::time::timeout(deadline, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => {
                return refuse(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "TOO_LARGE",
                    format!("request body: {e} (the limit is {MAX_BODY_BYTES} bytes)"),
                );
            }
            Err(_) => {
                return refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    "REQUEST_TIMEOUT",
                    format!("request body: not all received within {deadline:?}"),
                );
            }
        };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Whether `host` (a `Host` header: name or address, maybe a port) names
/// this machine's loopback: `localhost` (and names under it), `127.0.0.0/8`
/// or `[::1]`.
pub fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A refusal of a request that came through the wrong door.
fn wrong_door(message: String) -> Response {
    error::refuse(StatusCode::FORBIDDEN, "FORBIDDEN", message)
}

fn host_of(request: &Request) -> &str {
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// An open dashboard (loopback, no tokens) answers only requests for a
/// loopback name: a page of another site whose name was made to resolve
/// to 127.0.0.1 (DNS rebinding) sends its own name as `Host`. `baton dev`
/// puts its whole listener behind this when its dashboard is open.
pub async fn loopback_names_when_open(
    axum::extract::State(dashboard): axum::extract::State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    let host = host_of(&request);
    if dashboard.auth.is_open() && !loopback_host(host) {
        return wrong_door(format!(
            "host: {:?} is not a loopback name; this server is open (no tokens file) and answers only requests for localhost or 127.0.0.1",
            host.chars().take(100).collect::<String>()
        ));
    }
    next.run(request).await
}

/// No state-changing request whose `Origin` is another site than the one
/// asked (`Host`): the dashboard's actions and `baton dev`'s own routes
/// come from their own pages or from clients that send no `Origin`.
pub async fn same_origin(request: Request, next: Next) -> Response {
    let host = host_of(&request);
    let safe = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    if !safe && let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let authority = origin
            .split_once("://")
            .map_or("", |(_, rest)| rest.trim_end_matches('/'));
        if authority.is_empty() || !authority.eq_ignore_ascii_case(host) {
            tracing::warn!(
                origin = %origin.chars().take(100).collect::<String>(),
                host = %host.chars().take(100).collect::<String>(),
                path = %request.uri().path(),
                "refused a state-changing request from another site"
            );
            return wrong_door(format!(
                "origin: {:?} is not this dashboard ({host}); actions come from its own pages",
                origin.chars().take(100).collect::<String>()
            ));
        }
    }
    next.run(request).await
}

/// The sign-in page, its form and the bundle are open; everything else
/// needs a signed-in viewer (see [`auth::require_viewer`]).
async fn signed_in(
    axum::extract::State(dashboard): axum::extract::State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if path == "/dashboard/signin" || path.starts_with("/dashboard/pkg/") {
        return next.run(request).await;
    }
    auth::require_viewer(&dashboard.auth, request, next).await
}

/// No framing, no sniffing, no referrer beyond the dashboard, and no copy
/// kept of what it shows (`no-store`: sessions are private data). It also
/// keeps pages out of the browser's back/forward cache, where a frozen page
/// held its live-update connection open: six of them took every connection
/// the browser allows a host, and the next page waited 47 s for one.
async fn page_headers(request: Request, next: Next) -> Response {
    let bundle = request.uri().path().starts_with("/dashboard/pkg/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if !bundle {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers
        .entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// The browser bundle, gzipped for browsers that take it.
async fn asset(
    axum::extract::Path(file): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let (plain, gzipped, content_type) = match file.as_str() {
        "baton-web.js" => (assets::JS, assets::JS_GZ, "text/javascript"),
        "baton-web_bg.wasm" => (assets::WASM, assets::WASM_GZ, "application/wasm"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    if !assets::HYDRATES {
        return StatusCode::NOT_FOUND.into_response();
    }
    let gzip = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|e| e.trim().starts_with("gzip")));
    let mut response = if gzip { gzipped } else { plain }.into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response
}

/// `baton dashboard`: where to listen, which stores to read, who may sign in.
#[derive(clap::Args, Clone, Debug)]
pub struct DashboardArgs {
    /// Address of the dashboard; port 0 picks a free one (printed at start).
    #[arg(
        long,
        env = "BATON_DASHBOARD_LISTEN",
        default_value = "127.0.0.1:7080",
        hide_env_values = true
    )]
    pub listen: std::net::SocketAddr,

    /// Redis URL of the coordination store; with `--database-url`, the
    /// dashboard reads a deployment on Redis + Postgres.
    #[arg(long, env = baton_api::constants::env::REDIS_URL, hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Postgres URL of the turn ledger (with `--redis-url`).
    #[arg(long, env = baton_api::constants::env::DATABASE_URL, hide_env_values = true)]
    pub database_url: Option<String>,

    /// The deployment's store namespace (as its sidecars have it).
    #[arg(long, env = baton_api::constants::env::STORE_NAMESPACE, default_value = "", hide_env_values = true)]
    pub store_namespace: String,

    /// Without Redis and Postgres: the embedded store's database
    /// (`baton dev` keeps it in `.baton/dev/baton.db`).
    #[arg(
        long,
        env = "BATON_SQLITE_PATH",
        default_value = ".baton/dev/baton.db",
        hide_env_values = true
    )]
    pub sqlite_path: std::path::PathBuf,

    #[command(flatten)]
    pub workspace: baton_workspace::cli::WorkspaceArgs,

    /// YAML list of who may sign in: `- {name: alice, role: operator,
    /// token: <16+ characters>}` (role `viewer` reads only). Required
    /// unless the dashboard listens on a loopback address, where it is
    /// open to everyone as an operator.
    #[arg(long, env = "BATON_DASHBOARD_TOKENS_FILE", hide_env_values = true)]
    pub tokens_file: Option<std::path::PathBuf>,

    /// The admin token the sidecars accept (drain, takeover, status).
    #[arg(long, env = "BATON_DASHBOARD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Where the deployment's sidecars are: networks (`10.244.0.0/16`) or
    /// addresses, separated by commas. The dashboard calls a sidecar (with
    /// the admin token) only at an advertised URL whose host is an address
    /// in one of them: a heartbeat is store data, and whoever can write
    /// there could point it anywhere. Unset: with `--kubernetes`, only the
    /// admin ports of the deployment's pods (its headless Service's
    /// endpoints); without, no sidecar is called (no in-flight turns, drain
    /// or takeover).
    #[arg(
        long,
        env = "BATON_DASHBOARD_SIDECAR_NETWORKS",
        default_value = "",
        hide_env_values = true
    )]
    pub sidecar_networks: String,

    /// File the audit log is appended to (one JSON line per action);
    /// unset: kept in memory only.
    #[arg(long, env = "BATON_DASHBOARD_AUDIT_LOG", hide_env_values = true)]
    pub audit_log: Option<std::path::PathBuf>,

    /// Show the cluster's `AgentDeployment`s, and record every action as an
    /// event on this deployment's (named by `--store-namespace`
    /// `<namespace>.<name>`). Uses the kubeconfig, or the pod's service
    /// account; needs list on agentdeployments and create on events.
    #[arg(long, env = "BATON_DASHBOARD_KUBERNETES", hide_env_values = true)]
    pub kubernetes: bool,

    /// With `--kubernetes`: list this namespace's `AgentDeployment`s only.
    #[arg(
        long,
        env = "BATON_DASHBOARD_KUBERNETES_NAMESPACE",
        hide_env_values = true
    )]
    pub kubernetes_namespace: Option<String>,
}

/// A listener whose connections send at once (see [`baton_serve::no_delay`]).
pub use baton_serve::no_delay;

/// Who may sign in: the tokens file, or open on a loopback address only.
pub fn auth_for(
    tokens_file: Option<&std::path::Path>,
    listen: std::net::SocketAddr,
) -> Result<Auth, String> {
    match tokens_file {
        Some(path) => Auth::read(path),
        None if listen.ip().is_loopback() => Ok(Auth::open()),
        None => Err(format!(
            "BATON_DASHBOARD_TOKENS_FILE: required when the dashboard listens beyond loopback ({listen})"
        )),
    }
}

/// Opens the stores and serves the dashboard until the process ends.
pub async fn run(args: DashboardArgs) -> Result<(), String> {
    let auth = auth_for(args.tokens_file.as_deref(), args.listen)?;
    // `--kubernetes` with no store at all: the cluster's list only.
    let no_stores = args.redis_url.is_none()
        && args.database_url.is_none()
        && args.kubernetes
        && !args.sqlite_path.exists();
    let catalog: Arc<dyn Catalog> = match (&args.redis_url, &args.database_url) {
        (Some(redis), Some(database)) => Arc::new(
            baton_ledger::RedisCatalog::connect_in(redis, database, &args.store_namespace)
                .await
                .map_err(|e| format!("opening Redis and Postgres: {}", e.metric_label()))?,
        ),
        (None, None) if no_stores => {
            tracing::info!("no stores given: showing the cluster's AgentDeployments only");
            Arc::new(catalog::NoStores)
        }
        (None, None) => {
            if !args.sqlite_path.exists() {
                return Err(format!(
                    "BATON_SQLITE_PATH: {} does not exist (start `baton dev` first, or give --redis-url and --database-url)",
                    args.sqlite_path.display()
                ));
            }
            Arc::new(
                baton_store_sqlite::SqliteStore::open(&args.sqlite_path)
                    .await
                    .map_err(|e| format!("BATON_SQLITE_PATH: {e}"))?,
            )
        }
        _ => {
            return Err(
                "BATON_REDIS_URL and BATON_DATABASE_URL: give both (a deployment on Redis + Postgres) or neither (the embedded store)"
                    .into(),
            );
        }
    };
    let workspaces = if no_stores {
        None
    } else {
        Some(
            args.workspace
                .open(&args.store_namespace)
                .map_err(|e| format!("workspace store ({}): {e}", args.workspace.describe()))?,
        )
    };
    let audit = match &args.audit_log {
        Some(path) => Audit::at(path.clone())?,
        None => Audit::in_memory(),
    };
    let open = auth.is_open();
    let cluster = if args.kubernetes {
        Some(
            cluster::Cluster::connect(args.kubernetes_namespace.clone(), &args.store_namespace)
                .await?,
        )
    } else {
        None
    };
    // Given networks win; else, with the cluster, the deployment's pods.
    let vouch = match cluster.as_ref().and_then(cluster::Cluster::admin_endpoints) {
        Some(endpoints) if args.sidecar_networks.trim().is_empty() => {
            tracing::info!(
                "calling only the sidecars at the admin endpoints of the deployment's headless Service"
            );
            sidecars::Vouch::Endpoints(endpoints)
        }
        _ => sidecars::Vouch::networks(&args.sidecar_networks)?,
    };
    let mut dashboard = Dashboard::new(
        catalog,
        workspaces,
        Sidecars::new(args.admin_token.clone(), vouch),
        auth,
        audit,
    );
    if let Some(cluster) = cluster {
        dashboard = dashboard.with_cluster(cluster);
    }
    let dashboard = Arc::new(dashboard);
    dashboard.start_sampling();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("BATON_DASHBOARD_LISTEN: {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Tests and scripts read the first line to learn the address. One
    // write: a reader that stops after it must not break a second one.
    let access = if open {
        "open to everyone on this machine as an operator (loopback, no --tokens-file)"
    } else {
        "sign in with a token of --tokens-file"
    };
    println!("baton dashboard listening on http://{addr}/dashboard\n  {access}");
    let app = router(dashboard)
        .route("/", get(|| async { Redirect::to("/dashboard") }))
        // Liveness and readiness of the dashboard's pod (no sign-in).
        .route("/healthz", get(|| async { "ok" }));
    baton_serve::serve(
        no_delay(listener),
        app,
        baton_serve::Limits::DEFAULT,
        std::future::pending(),
    )
    .await;
    Ok(())
}
