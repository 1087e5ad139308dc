//! The control-plane dashboard, in Leptos: the pages are rendered on the
//! server (feature `ssr`: [`server::router`], mounted by `baton dashboard`
//! and `baton dev`) so they read without JavaScript, and the same
//! components hydrate in the browser (feature `hydrate`, built for wasm32
//! by `build.rs` and embedded in the server) to follow live updates.
//!
//! - [`pages`]: the sessions table, a session, the replicas, the audit log,
//!   sign-in and the confirmation of actions;
//! - [`model`]: what the server sends a page; [`format`]: how times, sizes
//!   and paths are written;
//! - [`server`]: data from the stores and the sidecars, sign-in, actions,
//!   live updates (server-sent events), the bundle.
//!
//! Every path lives under `/dashboard`, so the dashboard can share a
//! listener with the agent's API (`baton dev`'s front door).

pub mod format;
pub mod model;
pub mod pages;
#[cfg(feature = "ssr")]
pub mod server;

use leptos::prelude::*;
#[cfg(feature = "ssr")]
use leptos_meta::MetaTags;
use leptos_meta::{Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

use crate::model::Viewer;

/// The page around the app, rendered on the server.
#[cfg(feature = "ssr")]
pub fn shell(options: LeptosOptions) -> impl IntoView {
    let hydrates = server::assets::HYDRATES;
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <meta name="color-scheme" content="light dark"/>
                {hydrates.then(|| view! { <HydrationScripts options/> })}
                <MetaTags/>
                <style>{STYLE}</style>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

#[cfg(feature = "ssr")]
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;font-size:14px}\
header{display:flex;gap:1.25rem;align-items:center;padding:.6rem 1.5rem;border-bottom:1px solid #8884}\
header .who{margin-left:auto;display:flex;gap:.5rem;align-items:center}\
main{padding:0 1.5rem 2rem}\
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.25rem .7rem;text-align:left;border-bottom:1px solid #8883;vertical-align:top}\
th{font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}\
.error,.failed{color:#c62828}.warning{color:#a15c00}.ok{color:#2e7d32}.muted{color:#888}\
.leased{font-weight:600}.free{color:#888}\
form.filters{display:flex;gap:.75rem;align-items:end;flex-wrap:wrap;margin:1rem 0}\
form.filters label{display:flex;flex-direction:column;font-size:12px}\
.banner{padding:.5rem .75rem;border-radius:4px;background:#8881;margin:.75rem 0}\
pre{background:#8881;padding:.5rem;overflow:auto;max-height:24rem;white-space:pre-wrap}\
button.danger{color:#fff;background:#c62828;border:0;padding:.35rem .8rem;border-radius:3px}\
svg.timeline text{font-size:11px;fill:currentColor}\
.said{white-space:pre-wrap;overflow-wrap:anywhere}td.said-cell{max-width:40rem}\
section.running{border-left:3px solid #1565c0;padding:.1rem 1rem;margin:1rem 0;max-width:60rem}\
pre.stream{overflow-wrap:anywhere}a.danger{color:#c62828}";

/// The app: one route per page, all under `/dashboard`.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Title text="Baton"/>
        <Router>
            <Routes fallback=|| view! { <main><p>"No such page."</p></main> }>
                <Route path=path!("/dashboard") view=pages::sessions::SessionsPage/>
                <Route path=path!("/dashboard/signin") view=pages::signin::SignInPage/>
                <Route
                    path=path!("/dashboard/sessions/:tenant/:session")
                    view=pages::session::SessionPage
                />
                <Route path=path!("/dashboard/replicas") view=pages::replicas::ReplicasPage/>
                <Route path=path!("/dashboard/audit") view=pages::audit::AuditPage/>
                <Route path=path!("/dashboard/confirm") view=pages::confirm::ConfirmPage/>
            </Routes>
        </Router>
    }
}

/// The bar on every signed-in page: where to go, who is looking.
#[component]
pub fn Header(viewer: Viewer) -> impl IntoView {
    let role = viewer.role.as_str();
    view! {
        <header>
            <strong>"Baton"</strong>
            <A href="/dashboard">"Sessions"</A>
            <A href="/dashboard/replicas">"Replicas"</A>
            <A href="/dashboard/audit">"Audit"</A>
            <span class="who">
                <span id="viewer">{viewer.name.clone()} " (" {role} ")"</span>
                {(!viewer.open).then(|| view! {
                    <form method="post" action="/dashboard/signout">
                        <button type="submit">"Sign out"</button>
                    </form>
                })}
            </span>
        </header>
        {viewer.open.then(|| view! {
            <p class="banner" id="open-mode">
                "Open dashboard: anyone who reaches this loopback address acts as an operator. "
                "Give it a tokens file (--tokens-file, or --dashboard-tokens-file for baton dev) to require sign-in."
            </p>
        })}
    }
}

/// The browser's entry point: takes over the server-rendered page.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    // A panic in the browser says what it was on the console.
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(App);
    // Says the page is live (browser tests wait for it).
    if let Some(body) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.body())
    {
        let _ = body.set_attribute("data-hydrated", "true");
    }
}
