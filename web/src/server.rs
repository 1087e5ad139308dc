//! The server half: the stores behind the server functions, and the axum
//! router that renders the pages and answers the server functions.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use baton_session::{ListQuery, SessionCatalog, TenantId};
use baton_views::SessionPage;
use leptos::prelude::*;
use leptos_axum::{LeptosRoutes, generate_route_list};

use crate::{App, shell};

/// Sessions a page of the dashboard shows at once.
pub const PAGE_SIZE: u32 = 100;

type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// What the dashboard reads, object-safe so one router serves any store.
/// Errors are messages for the page: they name the field and the rule, and
/// never a store URL or password.
pub trait Catalog: Send + Sync + 'static {
    fn sessions<'a>(
        &'a self,
        tenant: Option<&'a str>,
        prefix: Option<&'a str>,
    ) -> Answer<'a, SessionPage>;
}

impl<T: SessionCatalog + 'static> Catalog for T {
    fn sessions<'a>(
        &'a self,
        tenant: Option<&'a str>,
        prefix: Option<&'a str>,
    ) -> Answer<'a, SessionPage> {
        Box::pin(async move {
            let tenant = tenant
                .map(TenantId::new)
                .transpose()
                .map_err(|e| format!("tenant: {e}"))?;
            let query = ListQuery {
                tenant,
                prefix: prefix.map(str::to_owned),
                after: None,
                limit: PAGE_SIZE,
            };
            match self.list_sessions(&query).await {
                Ok(page) => Ok(page.to_view()),
                Err(e) => {
                    // The page gets the kind only; the log gets the detail.
                    tracing::warn!(error = %e, "dashboard: listing sessions failed");
                    Err(format!(
                        "listing sessions failed: the store answered {}",
                        e.metric_label()
                    ))
                }
            }
        })
    }
}

/// The catalog as the server functions find it in their context.
pub type SharedCatalog = Arc<dyn Catalog>;

/// Every page and server function of the dashboard over `catalog`.
pub fn router(catalog: SharedCatalog) -> axum::Router {
    let options = LeptosOptions::builder().output_name("baton-web").build();
    let routes = generate_route_list(App);
    axum::Router::new()
        .leptos_routes_with_context(
            &options,
            routes,
            move || provide_context(catalog.clone()),
            shell,
        )
        .with_state(options)
}

/// `baton dashboard`: where to listen and which stores to read.
#[derive(clap::Args, Clone, Debug)]
pub struct DashboardArgs {
    /// Address of the dashboard; port 0 picks a free one (printed at start).
    #[arg(long, env = "BATON_DASHBOARD_LISTEN", default_value = "127.0.0.1:7080")]
    pub listen: std::net::SocketAddr,

    /// Redis URL of the coordination store; with `--database-url`, the
    /// dashboard reads a deployment on Redis + Postgres.
    #[arg(long, env = baton_api::constants::env::REDIS_URL, hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Postgres URL of the turn ledger (with `--redis-url`).
    #[arg(long, env = baton_api::constants::env::DATABASE_URL, hide_env_values = true)]
    pub database_url: Option<String>,

    /// The deployment's store namespace (as its sidecars have it).
    #[arg(long, env = baton_api::constants::env::STORE_NAMESPACE, default_value = "")]
    pub store_namespace: String,

    /// Without Redis and Postgres: the embedded store's database
    /// (`baton dev` keeps it in `.baton/dev/baton.db`).
    #[arg(long, env = "BATON_SQLITE_PATH", default_value = ".baton/dev/baton.db")]
    pub sqlite_path: std::path::PathBuf,
}

/// Opens the stores and serves the dashboard until the process ends.
pub async fn run(args: DashboardArgs) -> Result<(), String> {
    let catalog: SharedCatalog = match (&args.redis_url, &args.database_url) {
        (Some(redis), Some(database)) => Arc::new(
            baton_session::catalog::RedisCatalog::connect_in(
                redis,
                database,
                &args.store_namespace,
            )
            .await
            .map_err(|e| format!("opening Redis and Postgres: {}", e.metric_label()))?,
        ),
        (None, None) => {
            if !args.sqlite_path.exists() {
                return Err(format!(
                    "BATON_SQLITE_PATH: {} does not exist (start `baton dev` first, or give --redis-url and --database-url)",
                    args.sqlite_path.display()
                ));
            }
            Arc::new(
                baton_session::sqlite::SqliteStore::open(&args.sqlite_path)
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
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("BATON_DASHBOARD_LISTEN: {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Tests and scripts read this line to learn the address.
    println!("baton dashboard listening on http://{addr}");
    axum::serve(listener, router(catalog))
        .await
        .map_err(|e| e.to_string())
}
