//! The control-plane dashboard, in Leptos: the pages are rendered on the
//! server (feature `ssr`: [`server::router`], mounted by `baton dashboard`)
//! so they read without JavaScript, and the same components hydrate in the
//! browser (feature `hydrate`, built for wasm32) for live updates.
//!
//! Data comes from server functions over a [`server::Catalog`], the
//! read-only view of the stores (`baton-session`'s `SessionCatalog`); the
//! types on the wire are `baton-views`', which compile to wasm.
//!
//! Status: the sessions page, server-rendered, with its filters. The wasm
//! build, live updates, the session and replica pages, actions and sign-in
//! are issue 14's next steps.

use baton_views::SessionPage;
use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::hooks::use_query_map;
use leptos_router::path;

#[cfg(feature = "ssr")]
pub mod server;

/// The page around the app.
pub fn shell() -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <MetaTags/>
                <style>{STYLE}</style>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5rem}\
table{border-collapse:collapse}td,th{padding:.25rem .75rem;text-align:left;border-bottom:1px solid #ddd}\
th{font-weight:600}.error{color:#b00020}form{margin:1rem 0}";

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Title text="Baton"/>
        <Router>
            <main>
                <Routes fallback=|| view! { <p>"No such page."</p> }>
                    <Route path=path!("/") view=SessionsPage/>
                </Routes>
            </main>
        </Router>
    }
}

/// One page of sessions in (tenant, session) order, filtered by tenant and
/// session id prefix.
#[server]
pub async fn list_sessions(
    tenant: Option<String>,
    prefix: Option<String>,
) -> Result<SessionPage, ServerFnError> {
    let catalog = use_context::<server::SharedCatalog>()
        .ok_or_else(|| ServerFnError::new("the dashboard has no store"))?;
    catalog
        .sessions(tenant.as_deref(), prefix.as_deref())
        .await
        .map_err(ServerFnError::new)
}

/// A query parameter, `None` when absent or empty.
fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

#[component]
fn SessionsPage() -> impl IntoView {
    let query = use_query_map();
    let filters = move || {
        let query = query.read();
        (
            non_empty(query.get("tenant")),
            non_empty(query.get("prefix")),
        )
    };
    let sessions = Resource::new(filters, |(tenant, prefix)| list_sessions(tenant, prefix));
    view! {
        <h1>"Sessions"</h1>
        <form method="get" action="/">
            <label>"tenant " <input name="tenant" value=move || filters().0.unwrap_or_default()/></label>
            " "
            <label>"session id starts with " <input name="prefix" value=move || filters().1.unwrap_or_default()/></label>
            " "
            <button type="submit">"Filter"</button>
        </form>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match sessions.await {
                    Ok(page) => view! { <SessionTable page/> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Suspense>
    }
}

/// The sessions of one page as a table; text is escaped by the renderer.
#[component]
pub fn SessionTable(page: SessionPage) -> impl IntoView {
    if page.sessions.is_empty() {
        return view! { <p id="no-sessions">"No sessions."</p> }.into_any();
    }
    view! {
        <table id="sessions">
            <thead>
                <tr>
                    <th>"tenant"</th>
                    <th>"session"</th>
                    <th>"version"</th>
                    <th>"last replica"</th>
                    <th>"turns"</th>
                    <th>"last turn (Unix ms)"</th>
                </tr>
            </thead>
            <tbody>
                {page
                    .sessions
                    .into_iter()
                    .map(|s| {
                        view! {
                            <tr class="session">
                                <td class="tenant">{s.tenant}</td>
                                <td class="id">{s.session}</td>
                                <td class="version">{s.version}</td>
                                <td class="replica">{s.last_replica.unwrap_or_default()}</td>
                                <td class="turns">{s.turn_count}</td>
                                <td class="at">{s.last_turn_at_ms}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

/// The browser's entry point: takes over the server-rendered page.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    leptos::mount::hydrate_body(App);
}
