//! The replicas: ready, draining or drained; heartbeat age; the turns in
//! flight and the sessions they hold; build; and, for operators, drain.

use leptos::prelude::*;

use crate::format::{ago, clock, duration, latency, session_path, sparkline, url_encode};
use crate::model::{ClusterView, RatePoint, ReplicaRow, ReplicasData, Viewer};
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
                                let cluster = shown.cluster.clone();
                                view! {
                                    <ReplicaTable data=shown viewer=viewer.clone()/>
                                    <Deployments cluster/>
                                }
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
                    <th class="num">"in flight"</th><th>"sessions held"</th>
                    <th>"turns/s (10 min)"</th><th>"p50 / p99"</th><th>"up"</th>
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
    let (rate, latencies) = plots(&row.recent);
    let info = row.view.info;
    view! {
        <tr class="replica" data-replica=info.replica.clone()>
            <td class="name">{info.replica.clone()}</td>
            <td><code>{row.view.id}</code></td>
            <td class=format!("state {state}")>{state}{error}</td>
            <td>{ago(now, row.view.last_seen_ms)}</td>
            <td class="num in-flight">{in_flight}</td>
            <td>{held}</td>
            <td class="rate">{rate}</td>
            <td class="latency">{latencies}</td>
            <td>{ago(now, info.started_at_ms)}</td>
            <td>{info.build}</td>
            <td>{shipping}</td>
            <td>{drain}</td>
        </tr>
    }
}

/// Small plots of the last minutes: turns/s, and p99 latency with the
/// latest p50 / p99 as text.
fn plots(recent: &[RatePoint]) -> (impl IntoView + use<>, impl IntoView + use<>) {
    const W: f64 = 120.0;
    const H: f64 = 24.0;
    if recent.is_empty() {
        let wait = || view! { <span class="muted">"sampling…"</span> };
        return (wait().into_any(), wait().into_any());
    }
    let rates: Vec<f64> = recent.iter().map(|p| p.turns_per_s).collect();
    let p99s: Vec<f64> = recent
        .iter()
        .map(|p| p.p99_ms.filter(|v| v.is_finite()).unwrap_or(0.0))
        .collect();
    let last = recent.last().cloned();
    let rate_text = last.as_ref().map_or(0.0, |p| p.turns_per_s);
    let latest = recent
        .iter()
        .rev()
        .find(|p| p.p50_ms.is_some())
        .map(|p| {
            format!(
                "{} / {}",
                latency(p.p50_ms.unwrap_or(0.0)),
                latency(p.p99_ms.unwrap_or(0.0))
            )
        })
        .unwrap_or_else(|| "no turns".into());
    let rate = view! {
        <svg width=W height=H class="spark"><polyline fill="none" stroke="#1565c0" points=sparkline(&rates, W, H)/></svg>
        " " {format!("{rate_text:.1}")}
    };
    let latencies = view! {
        <svg width=W height=H class="spark"><polyline fill="none" stroke="#c62828" points=sparkline(&p99s, W, H)/></svg>
        " " {latest}
    };
    (rate.into_any(), latencies.into_any())
}

/// The cluster's `AgentDeployment`s, when the dashboard has Kubernetes
/// access: replicas, revisions, rollout, conditions.
#[component]
fn Deployments(cluster: Option<ClusterView>) -> impl IntoView {
    let Some(cluster) = cluster else {
        return ().into_any();
    };
    let error = cluster
        .error
        .map(|e| view! { <p class="warning" id="cluster-error">{e}</p> });
    let rows = cluster
        .deployments
        .into_iter()
        .map(|d| {
            let conditions = d
                .conditions
                .into_iter()
                .map(|c| {
                    let class = if c.status == "True" { "ok" } else { "warning" };
                    view! {
                        <span class=format!("condition {class}") title=format!("since {}", clock(c.since_ms))>
                            {c.type_} "=" {c.status} " " {c.reason} ": " {c.message}
                        </span>
                        <br/>
                    }
                })
                .collect_view();
            let key = format!("{}/{}", d.namespace, d.name);
            view! {
                <tr class="deployment" data-name=key>
                    <td>{d.namespace}</td>
                    <td class="name">{d.name}</td>
                    <td class="num">{d.ready} " / " {d.desired}</td>
                    <td class="num">{d.updated}</td>
                    <td><code>{d.current_revision}</code> " → " <code>{d.update_revision}</code></td>
                    <td class="rollout">{d.rollout.unwrap_or_else(|| "-".into())}</td>
                    <td class="conditions">{conditions}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <h2>"AgentDeployments"</h2>
        {error}
        <table id="deployments">
            <thead>
                <tr><th>"namespace"</th><th>"name"</th><th class="num">"ready"</th><th class="num">"updated"</th>
                    <th>"revision"</th><th>"rollout"</th><th>"conditions"</th></tr>
            </thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}
