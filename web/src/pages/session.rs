//! One session: version, fence, lease, last replica; its turn history from
//! the ledger with a timeline by replica; the workspace files of its
//! current version; its state behind a reveal (it can hold personal data);
//! and, for operators, the takeover.

use baton_views::TurnView;
use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::format::{ago, clock, duration, expires, replica_of, short_digest, url_encode};
use crate::model::{LiveOutput, OutputData, SessionData, Viewer};
use crate::pages::{Signed, error_text, live, load_session};

#[component]
pub fn SessionPage() -> impl IntoView {
    view! { <Signed page=|viewer| view! { <Session viewer/> }/> }
}

#[component]
fn Session(viewer: Viewer) -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let key = Memo::new(move |_| {
        let p = params.read();
        (
            p.get("tenant").unwrap_or_default(),
            p.get("session").unwrap_or_default(),
        )
    });
    let reveal = Memo::new(move |_| query.read().get("reveal").is_some_and(|v| v == "state"));
    let data = Resource::new(
        move || (key.get(), reveal.get()),
        |((tenant, session), reveal)| load_session(tenant, session, reveal),
    );
    let latest = RwSignal::new(None::<SessionData>);
    // The running turn's words come on a channel of their own, four times
    // a second; the rest of the page once a second.
    let output = RwSignal::new(None::<OutputData>);
    live(
        move || {
            let (tenant, session) = key.get();
            format!(
                "/dashboard/live/sessions/{}/{}/output",
                url_encode(&tenant),
                url_encode(&session)
            )
        },
        output,
    );
    live(
        move || {
            let (tenant, session) = key.get();
            format!(
                "/dashboard/live/sessions/{}/{}",
                url_encode(&tenant),
                url_encode(&session)
            )
        },
        latest,
    );
    view! {
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || {
                let viewer = viewer.clone();
                Suspend::new(async move {
                    match data.await {
                        Ok(first) => {
                            latest.set(None);
                            // The state is read once, when revealed; live
                            // updates carry everything else.
                            let state = first.state.clone();
                            let first_output = first.output.clone();
                            let running = Signal::derive(move || match output.get() {
                                Some(fast) => fast.output,
                                None => latest
                                    .get()
                                    .map_or_else(|| first_output.clone(), |d| d.output),
                            });
                            view! {
                                {move || {
                                    let shown = latest.get().unwrap_or_else(|| first.clone());
                                    view! { <SessionView data=shown viewer=viewer.clone() running/> }
                                }}
                                <StateReveal state/>
                            }
                            .into_any()
                        }
                        Err(e) => view! { <p class="error" id="error">{error_text(&e)}</p> }.into_any(),
                    }
                })
            }}
        </Suspense>
    }
}

#[component]
fn SessionView(
    data: SessionData,
    viewer: Viewer,
    running: Signal<Option<LiveOutput>>,
) -> impl IntoView {
    let now = data.now_ms;
    let title = view! {
        <h1>"Session " <span id="session-id">{data.session.clone()}</span>
            " " <small class="muted">"tenant " {data.tenant.clone()}</small></h1>
    };
    let warnings = data
        .warnings
        .iter()
        .map(|w| view! { <p class="warning">{w.clone()}</p> })
        .collect_view();
    let takeover = viewer.may_act().then(|| {
        let href = format!(
            "/dashboard/confirm?action=takeover&tenant={}&session={}",
            url_encode(&data.tenant),
            url_encode(&data.session)
        );
        view! { <p><a id="takeover" href=href>"Take over this session…"</a></p> }
    });
    let Some(view) = data.view else {
        return view! {
            {title}
            {warnings}
            <p id="no-state">"The store has no state for this session: it never ran a turn, or its state expired."</p>
        }
        .into_any();
    };
    let held = data.lease_held_ms.map(|ms| {
        format!(
            ", acquired {} ({} ago)",
            clock(now.saturating_sub(ms)),
            duration(ms)
        )
    });
    let lease = match &view.lease {
        Some(l) => view! {
            <span class="leased" id="lease">
                {l.owner.clone()} " runs turn " {l.turn_seq} " (fence " {l.fence} ")" {held}
                ", expires " {expires(now, l.expires_at_ms)}
            </span>
        }
        .into_any(),
        None => view! { <span class="free" id="lease">"free"</span> }.into_any(),
    };
    let files = data
        .files
        .iter()
        .map(|f| {
            let base = format!(
                "/dashboard/files/{}/{}/{}",
                url_encode(&data.tenant),
                url_encode(&data.session),
                f.name
                    .split('/')
                    .map(url_encode)
                    .collect::<Vec<_>>()
                    .join("/")
            );
            let text = f
                .text
                .clone()
                .map(|t| view! { <pre class="file-text">{t}</pre> });
            view! {
                <tr class="file" data-name=f.name.clone()>
                    <td class="name">{f.name.clone()}</td>
                    <td class="num">{f.size} " B"</td>
                    <td><code>{short_digest(&f.sha256).to_owned()}</code></td>
                    <td>
                        <a href=base.clone() target="_blank" rel="noopener">"view"</a> " · "
                        <a href=format!("{base}?download=true")>"download"</a>
                    </td>
                </tr>
                {text.map(|t| view! { <tr><td colspan="4">{t}</td></tr> })}
            }
        })
        .collect_view();
    let files_section = if data.files.is_empty() {
        view! { <p class="muted" id="no-files">"No workspace files."</p> }.into_any()
    } else {
        view! {
            <table id="files">
                <thead><tr><th>"file"</th><th class="num">"size"</th><th>"sha-256"</th><th></th></tr></thead>
                <tbody>{files}</tbody>
            </table>
        }
        .into_any()
    };
    let turns = view.turns.clone();
    let may_act = viewer.may_act();
    let (tenant, session) = (data.tenant.clone(), data.session.clone());
    view! {
        {title}
        {warnings}
        <table id="facts"><tbody>
            <tr><th>"version"</th><td id="version">{view.version}</td></tr>
            <tr><th>"fence"</th><td id="fence">{view.fence}</td></tr>
            <tr><th>"lease"</th><td>{lease}</td></tr>
            <tr><th>"last replica"</th><td id="last-replica">{view.last_replica.clone().unwrap_or_default()}</td></tr>
            <tr><th>"turns"</th><td>{view.last_turn_seq}</td></tr>
            <tr><th>"last commit"</th><td title=clock(view.updated_at_ms)>{ago(now, view.updated_at_ms)}</td></tr>
        </tbody></table>
        {takeover}
        {move || {
            running
                .get()
                .map(|output| view! { <RunningTurn output may_act tenant=tenant.clone() session=session.clone()/> })
        }}
        <h2>"Turns"</h2>
        <Timeline turns=turns.clone()/>
        <TurnTable turns/>
        <h2>"Workspace (version " {view.version} ")"</h2>
        {files_section}
    }
    .into_any()
}

/// What the running turn has streamed so far, and (for operators) its
/// Stop.
#[component]
fn RunningTurn(
    output: LiveOutput,
    may_act: bool,
    tenant: String,
    session: String,
) -> impl IntoView {
    let stop = may_act.then(|| {
        let href = format!(
            "/dashboard/confirm?action=interrupt&tenant={}&session={}&turn={}",
            url_encode(&tenant),
            url_encode(&session),
            output.turn_seq
        );
        view! { <a id="stop" class="danger" href=href>"Stop this turn…"</a> }
    });
    let voided = (output.voided_attempts > 0).then(|| {
        format!(
            "; the words of {} earlier attempt(s) were voided",
            output.voided_attempts
        )
    });
    let doing = output
        .doing
        .clone()
        .map(|d| view! { " · " <span id="live-doing">{d}</span> });
    let words = if output.events == 0 {
        view! {
            <p class="muted" id="live-output-none">
                "Nothing streamed yet: its replica keeps its words for this page from its next lease check on "
                "(an agent that answers at once streams nothing)."
            </p>
        }
        .into_any()
    } else {
        let cut = output.cut.then_some("…");
        view! { <pre class="stream" id="live-output">{cut}{output.text.clone()}</pre> }.into_any()
    };
    view! {
        <section class="running" id="running-turn" data-seq=output.turn_seq>
            <h2>"Running now: turn " {output.turn_seq}</h2>
            <p class="muted">
                "on " {output.owner.clone()} ", attempt " {output.attempt} {voided} {doing}
            </p>
            {words}
            <p class="muted">"Provisional: these words become the session's only if the turn commits."</p>
            <p>{stop}</p>
        </section>
    }
}

/// Past this many characters, an input or a reply is folded: its start
/// shows, the rest on request.
const FOLD_AT: usize = 240;

/// A turn's input or reply, as text (escaped like every text node), folded
/// when long.
fn said(text: String) -> AnyView {
    if text.chars().count() <= FOLD_AT {
        return view! { <span class="said">{text}</span> }.into_any();
    }
    let head: String = text.chars().take(FOLD_AT).collect();
    view! {
        <details class="said folded">
            <summary>{head}"…"</summary>
            <span class="said">{text}</span>
        </details>
    }
    .into_any()
}

/// The turn history, oldest first: what was said when the ledger keeps the
/// text (`spec.ledger.content: full`), the digests of it always.
#[component]
fn TurnTable(turns: Vec<TurnView>) -> impl IntoView {
    if turns.is_empty() {
        return view! { <p class="muted" id="no-turns">"The ledger has no turns for it yet."</p> }
            .into_any();
    }
    let rows = turns
        .into_iter()
        .rev()
        .map(|t| {
            view! {
                <tr class="turn" data-seq=t.turn_seq>
                    <td class="num seq">{t.turn_seq}</td>
                    <td class="num version">{t.version}</td>
                    <td class="replica">{t.replica.clone()}</td>
                    <td class="num">{t.fence}</td>
                    <td>{clock(t.started_at_ms)}</td>
                    <td>{clock(t.committed_at_ms)}</td>
                    <td class="num">{duration(t.committed_at_ms.saturating_sub(t.started_at_ms))}</td>
                    {if t.interrupted {
                        view! { <td class="warning outcome">"interrupted"</td> }.into_any()
                    } else {
                        view! { <td class="ok outcome">"committed"</td> }.into_any()
                    }}
                    <td class="said-cell">
                        {t.input.clone().map(|input| view! {
                            <div class="said-in"><span class="muted">"in "</span>{said(input)}</div>
                        })}
                        {t.reply.clone().map(|reply| view! {
                            <div class="said-out"><span class="muted">"out "</span>{said(reply)}</div>
                        })}
                        <details>
                            <summary>"digests"</summary>
                            "input " <code>{short_digest(&t.input_digest).to_owned()}</code>
                            ", reply " <code>{short_digest(&t.reply_digest).to_owned()}</code>
                        </details>
                    </td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table id="turns">
            <thead>
                <tr>
                    <th class="num">"turn"</th><th class="num">"version"</th><th>"replica"</th>
                    <th class="num">"fence"</th><th>"started"</th><th>"committed"</th>
                    <th class="num">"took"</th><th>"outcome"</th><th>"input / reply"</th>
                </tr>
            </thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

/// Where each turn ran, over time: one lane per replica.
#[component]
fn Timeline(turns: Vec<TurnView>) -> impl IntoView {
    let plot = timeline(&turns, 640.0);
    if plot.points.is_empty() {
        return ().into_any();
    }
    let height = 16.0 + 22.0 * plot.lanes.len() as f64;
    let lanes = plot
        .lanes
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let y = 20.0 + 22.0 * i as f64;
            view! {
                <text x="0" y=y + 4.0>{name.clone()}</text>
                <line x1="110" x2="750" y1=y y2=y stroke="#8884"/>
            }
        })
        .collect_view();
    let points = plot
        .points
        .into_iter()
        .map(|p| {
            view! {
                <circle cx=110.0 + p.x cy=20.0 + 22.0 * p.lane as f64 r="4" fill="#1565c0">
                    <title>{p.label}</title>
                </circle>
            }
        })
        .collect_view();
    view! {
        <svg class="timeline" id="timeline" width="760" height=height role="img"
            aria-label="turns by replica over time">
            {lanes}
            {points}
        </svg>
    }
    .into_any()
}

pub struct Plot {
    /// Replica names, in order of their first turn.
    pub lanes: Vec<String>,
    pub points: Vec<Point>,
}

pub struct Point {
    pub x: f64,
    pub lane: usize,
    pub label: String,
}

/// Each turn at its commit time (scaled to `width`) in its replica's lane.
pub fn timeline(turns: &[TurnView], width: f64) -> Plot {
    let mut ordered: Vec<&TurnView> = turns.iter().collect();
    ordered.sort_by_key(|t| t.turn_seq);
    let first = ordered.iter().map(|t| t.committed_at_ms).min().unwrap_or(0);
    let last = ordered.iter().map(|t| t.committed_at_ms).max().unwrap_or(0);
    let span = (last - first).max(1) as f64;
    let mut lanes: Vec<String> = Vec::new();
    let points = ordered
        .into_iter()
        .map(|t| {
            let name = replica_of(&t.replica).to_owned();
            let lane = match lanes.iter().position(|l| *l == name) {
                Some(i) => i,
                None => {
                    lanes.push(name);
                    lanes.len() - 1
                }
            };
            Point {
                x: (t.committed_at_ms - first) as f64 / span * width,
                lane,
                label: format!(
                    "turn {} on {} at {}",
                    t.turn_seq,
                    t.replica,
                    clock(t.committed_at_ms)
                ),
            }
        })
        .collect();
    Plot { lanes, points }
}

/// The agent's state, shown only on request: it can hold personal data.
#[component]
fn StateReveal(state: Option<String>) -> impl IntoView {
    match state {
        Some(text) => view! {
            <h2>"State"</h2>
            <pre id="state">{text}</pre>
            <p><a href="?">"Hide the state"</a></p>
        }
        .into_any(),
        None => view! {
            <h2>"State"</h2>
            <p><a id="reveal-state" href="?reveal=state">"Reveal the agent's state"</a>
                <span class="muted">" (it can hold what users said)"</span></p>
        }
        .into_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(seq: u64, replica: &str, at: u64) -> TurnView {
        TurnView {
            turn_seq: seq,
            version: seq,
            replica: replica.into(),
            fence: seq,
            input_digest: String::new(),
            reply_digest: String::new(),
            workspace: None,
            started_at_ms: at - 5,
            committed_at_ms: at,
            input: None,
            reply: None,
            interrupted: false,
        }
    }

    #[test]
    fn the_timeline_puts_each_turn_in_its_replicas_lane() {
        let plot = timeline(
            &[
                turn(3, "replica-0-aaaaaa", 3000),
                turn(2, "replica-1-bbbbbb", 2000),
                turn(1, "replica-0-cccccc", 1000),
            ],
            100.0,
        );
        assert_eq!(plot.lanes, ["replica-0", "replica-1"]);
        let at: Vec<(f64, usize)> = plot.points.iter().map(|p| (p.x, p.lane)).collect();
        assert_eq!(at, [(0.0, 0), (50.0, 1), (100.0, 0)]);
        assert!(timeline(&[], 100.0).points.is_empty());
    }
}
