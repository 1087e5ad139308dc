//! The sessions table: every session with its version, who holds its lease
//! (and for how long), where it last ran; filters by tenant, id prefix,
//! replica and "leased now"; keyset pages; live.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::format::{ago, clock, expires, session_path};
use crate::model::{Filters, SessionsData};
use crate::pages::{Signed, error_text, live, load_sessions};

#[component]
pub fn SessionsPage() -> impl IntoView {
    view! { <Signed page=|_viewer| view! { <Sessions/> }/> }
}

#[component]
fn Sessions() -> impl IntoView {
    let query = use_query_map();
    let filters = Memo::new(move |_| {
        let query = query.read();
        Filters::from_query(|name| query.get(name))
    });
    let data = Resource::new(
        move || filters.get(),
        |f| {
            load_sessions(
                f.tenant,
                f.prefix,
                f.replica,
                f.leased,
                f.after.as_ref().map(|a| a.tenant.clone()),
                f.after.map(|a| a.session),
            )
        },
    );
    let latest = RwSignal::new(None::<SessionsData>);
    live(
        move || format!("/dashboard/live/sessions{}", filters.get().query()),
        latest,
    );
    let value = move |f: fn(&Filters) -> Option<String>| f(&filters.get()).unwrap_or_default();
    view! {
        <h1>"Sessions"</h1>
        <form class="filters" method="get" action="/dashboard">
            <label>"tenant" <input name="tenant" value=move || value(|f| f.tenant.clone())/></label>
            <label>"session id starts with" <input name="prefix" value=move || value(|f| f.prefix.clone())/></label>
            <label>"last replica" <input name="replica" value=move || value(|f| f.replica.clone())/></label>
            <label>
                "leased now"
                <input type="checkbox" name="leased" value="1" checked=move || filters.get().leased/>
            </label>
            <button type="submit">"Filter"</button>
            <a href="/dashboard">"Clear"</a>
        </form>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(first) => {
                        latest.set(None);
                        view! {
                            {move || {
                                let shown = latest.get().unwrap_or_else(|| first.clone());
                                view! { <SessionTable data=shown filters=filters.get()/> }
                            }}
                        }
                        .into_any()
                    }
                    Err(e) => view! { <p class="error" id="error">{error_text(&e)}</p> }.into_any(),
                }
            })}
        </Suspense>
    }
}

/// The rows of one page, and the link to the next. Text is escaped by
/// the renderer: an id like `<script>` shows as itself.
#[component]
pub fn SessionTable(data: SessionsData, filters: Filters) -> impl IntoView {
    let now = data.now_ms;
    let warnings = data
        .warnings
        .into_iter()
        .map(|w| view! { <p class="warning">{w}</p> })
        .collect_view();
    let next = data.next.map(|next| {
        let href = format!(
            "/dashboard{}",
            Filters {
                after: Some(next),
                ..filters.clone()
            }
            .query()
        );
        view! { <p><a id="next-page" href=href>"Next page →"</a></p> }
    });
    if data.rows.is_empty() {
        return view! { {warnings} <p id="no-sessions">"No sessions."</p> }.into_any();
    }
    let rows = data
        .rows
        .into_iter()
        .map(|row| {
            let s = row.summary;
            let href = session_path(&s.tenant, &s.session);
            let lease = match row.lease {
                Some(l) => view! {
                    <td class="lease leased" title=format!("fence {}, turn {}", l.fence, l.turn_seq)>
                        {l.owner} ", expires " {expires(now, l.expires_at_ms)}
                    </td>
                }
                .into_any(),
                None => view! { <td class="lease free">"free"</td> }.into_any(),
            };
            view! {
                <tr class="session" data-key=format!("{}/{}", s.tenant, s.session)>
                    <td class="tenant">{s.tenant.clone()}</td>
                    <td class="id"><a href=href>{s.session.clone()}</a></td>
                    <td class="version num">{s.version}</td>
                    {lease}
                    <td class="replica">{s.last_replica.unwrap_or_default()}</td>
                    <td class="turns num">{s.turn_count}</td>
                    <td class="at" title=clock(s.last_turn_at_ms)>{ago(now, s.last_turn_at_ms)}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        {warnings}
        <table id="sessions">
            <thead>
                <tr>
                    <th>"tenant"</th>
                    <th>"session"</th>
                    <th class="num">"version"</th>
                    <th>"lease"</th>
                    <th>"last replica"</th>
                    <th class="num">"turns"</th>
                    <th>"last turn"</th>
                </tr>
            </thead>
            <tbody>{rows}</tbody>
        </table>
        {next}
    }
    .into_any()
}
