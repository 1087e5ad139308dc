//! The replicas: ready, draining or drained; heartbeat age; the turns in
//! flight and the sessions they hold; build; and, for operators, drain.

use leptos::prelude::*;

use crate::format::{ago, duration, session_path, url_encode};
use crate::model::{ReplicaRow, ReplicasData, Viewer};
use crate::pages::{Signed, error_text, live, load_replicas};

#[component]
pub fn ReplicasPage() -> impl IntoView {
    view! { <Signed page=|viewer| view! { <Replicas viewer/> }/> }
}

#[component]
fn Replicas(viewer: Viewer) -> impl IntoView {
    let data = Resource::new(|| (), |_| load_replicas());
    let latest = RwSignal::new(None::<ReplicasData>);
    live(|| "/dashboard/live/replicas".to_owned(), latest);
    view! {
        <h1>"Replicas"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || {
                let viewer = viewer.clone();
                Suspend::new(async move {
                    match data.await {
                        Ok(first) => view! {
                            {move || {
                                let shown = latest.get().unwrap_or_else(|| first.clone());
                                view! { <ReplicaTable data=shown viewer=viewer.clone()/> }
                            }}
                        }
                        .into_any(),
                        Err(e) => view! { <p class="error" id="error">{error_text(&e)}</p> }.into_any(),
                    }
                })
            }}
        </Suspense>
    }
}

#[component]
fn ReplicaTable(data: ReplicasData, viewer: Viewer) -> impl IntoView {
    if data.replicas.is_empty() {
        return view! { <p id="no-replicas">"No replica is heartbeating."</p> }.into_any();
    }
    let now = data.now_ms;
    let rows = data
        .replicas
        .into_iter()
        .map(|row| replica_row(row, now, &viewer))
        .collect_view();
    view! {
        <table id="replicas">
            <thead>
                <tr>
                    <th>"replica"</th><th>"holder id"</th><th>"state"</th><th>"heartbeat"</th>
                    <th class="num">"in flight"</th><th>"sessions held"</th><th>"up"</th>
                    <th>"build"</th><th>"shipping"</th><th></th>
                </tr>
            </thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

fn replica_row(row: ReplicaRow, now: u64, viewer: &Viewer) -> impl IntoView + use<> {
    let state = row.state();
    let held = row
        .turns()
        .iter()
        .map(|t| {
            let href = session_path(&t.tenant, &t.session);
            view! {
                <a class="held" href=href>{format!("{}/{}", t.tenant, t.session)}</a>
                <span class="muted">" " {duration(t.running_ms)}</span>
                <br/>
            }
        })
        .collect_view();
    let error = row
        .error
        .clone()
        .map(|e| view! { <br/><span class="warning">{e}</span> });
    let drain = (viewer.may_act() && state == "ready").then(|| {
        let href = format!(
            "/dashboard/confirm?action=drain&replica={}",
            url_encode(&row.view.info.replica)
        );
        view! { <a class="drain" href=href>"Drain…"</a> }
    });
    let shipping = match row.view.info.oldest_unshipped_ms {
        Some(at) => format!("behind by {}", duration(now.saturating_sub(at))),
        None => "up to date".to_owned(),
    };
    let in_flight = row.in_flight();
    let info = row.view.info;
    view! {
        <tr class="replica" data-replica=info.replica.clone()>
            <td class="name">{info.replica.clone()}</td>
            <td><code>{row.view.id}</code></td>
            <td class=format!("state {state}")>{state}{error}</td>
            <td>{ago(now, row.view.last_seen_ms)}</td>
            <td class="num in-flight">{in_flight}</td>
            <td>{held}</td>
            <td>{ago(now, info.started_at_ms)}</td>
            <td>{info.build}</td>
            <td>{shipping}</td>
            <td>{drain}</td>
        </tr>
    }
}
