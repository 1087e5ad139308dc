//! The pages, and the server functions they read through. Each page loads
//! its data with a server function (so the server renders it complete,
//! and a page works without JavaScript), then, once hydrated, follows the
//! server's live updates for the same data (see [`live`]).

pub mod audit;
pub mod confirm;
pub mod replicas;
pub mod session;
pub mod sessions;
pub mod signin;

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::Header;
use crate::model::{AuditEntry, ReplicasData, SessionData, SessionsData, Viewer};

/// Server functions live under the dashboard's prefix, clear of the
/// agent's `/api/chat` on a shared listener.
#[server(prefix = "/dashboard/api")]
pub async fn whoami() -> Result<Viewer, ServerFnError> {
    crate::server::viewer().await
}

#[server(prefix = "/dashboard/api")]
pub async fn load_sessions(
    tenant: Option<String>,
    prefix: Option<String>,
    replica: Option<String>,
    leased: bool,
    after_tenant: Option<String>,
    after_session: Option<String>,
) -> Result<SessionsData, ServerFnError> {
    crate::server::viewer().await?;
    let filters = crate::model::Filters::from_query(|name| match name {
        "tenant" => tenant.clone(),
        "prefix" => prefix.clone(),
        "replica" => replica.clone(),
        "leased" => leased.then(|| "1".into()),
        "after_tenant" => after_tenant.clone(),
        "after_session" => after_session.clone(),
        _ => None,
    });
    let dashboard = crate::server::dashboard()?;
    crate::server::data::sessions(&dashboard, &filters)
        .await
        .map_err(ServerFnError::new)
}

#[server(prefix = "/dashboard/api")]
pub async fn load_session(
    tenant: String,
    session: String,
    reveal_state: bool,
) -> Result<SessionData, ServerFnError> {
    crate::server::viewer().await?;
    let dashboard = crate::server::dashboard()?;
    crate::server::data::session(&dashboard, &tenant, &session, reveal_state)
        .await
        .map_err(ServerFnError::new)
}

#[server(prefix = "/dashboard/api")]
pub async fn load_replicas() -> Result<ReplicasData, ServerFnError> {
    crate::server::viewer().await?;
    let dashboard = crate::server::dashboard()?;
    crate::server::data::replicas(&dashboard)
        .await
        .map_err(ServerFnError::new)
}

#[server(prefix = "/dashboard/api")]
pub async fn load_audit() -> Result<Vec<AuditEntry>, ServerFnError> {
    crate::server::viewer().await?;
    Ok(crate::server::dashboard()?.audit.entries())
}

/// A server function's error as the page says it (without the
/// framework's prefix).
pub fn error_text(e: &ServerFnError) -> String {
    let text = e.to_string();
    text.strip_prefix("error running server function: ")
        .unwrap_or(&text)
        .to_owned()
}

/// A signed-in page: the header, then `page` with its viewer.
#[component]
pub fn Signed<F, V>(page: F) -> impl IntoView
where
    F: Fn(Viewer) -> V + Send + Sync + 'static,
    V: IntoView + 'static,
{
    let viewer = Resource::new(|| (), |_| whoami());
    let page = std::sync::Arc::new(page);
    view! {
        <Suspense fallback=|| ()>
            {move || {
                let page = page.clone();
                Suspend::new(async move {
                    match viewer.await {
                        Ok(viewer) => view! {
                            <Header viewer=viewer.clone()/>
                            <main>
                                <Done/>
                                {page(viewer)}
                            </main>
                        }
                        .into_any(),
                        Err(e) => view! {
                            <main>
                                <p class="error">{error_text(&e)}</p>
                                <p><a href="/dashboard/signin">"Sign in"</a></p>
                            </main>
                        }
                        .into_any(),
                    }
                })
            }}
        </Suspense>
    }
}

/// After an action (`?done=<audit id>`): how it ended.
#[component]
fn Done() -> impl IntoView {
    let query = use_query_map();
    let done = move || query.read().get("done").and_then(|v| v.parse::<u64>().ok());
    let entries = Resource::new(done, |id| async move {
        match id {
            Some(_) => load_audit().await.ok(),
            None => None,
        }
    });
    view! {
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                let id = done();
                let entry = entries
                    .await
                    .and_then(|all| all.into_iter().find(|e| Some(e.id) == id));
                entry.map(|e| {
                    let class = if e.ok { "banner ok" } else { "banner failed" };
                    view! {
                        <p class=class id="done">
                            {e.action} " " {e.target} ": " {if e.ok { "done" } else { "failed" }} " — "
                            {e.detail}
                        </p>
                    }
                })
            })}
        </Suspense>
    }
}

/// Follows a page's live updates: each server-sent event at `url` (a JSON
/// document of the page's data) replaces `into`'s value. Runs only in the
/// browser; closed when the page (or its filters) goes away.
pub fn live<T>(url: impl Fn() -> String + 'static, into: RwSignal<Option<T>>)
where
    T: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| {
        use send_wrapper::SendWrapper;
        use wasm_bindgen::JsCast as _;
        use wasm_bindgen::closure::Closure;

        let url = url();
        let Ok(source) = web_sys::EventSource::new(&url) else {
            return;
        };
        let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(
            move |event: web_sys::MessageEvent| {
                if let Some(text) = event.data().as_string()
                    && let Ok(value) = serde_json::from_str::<T>(&text)
                {
                    into.set(Some(value));
                }
            },
        );
        source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        let held = SendWrapper::new((source, on_message));
        on_cleanup(move || {
            let (source, _closure) = held.take();
            source.close();
        });
    });
    #[cfg(not(feature = "hydrate"))]
    let _ = (url, into);
}
