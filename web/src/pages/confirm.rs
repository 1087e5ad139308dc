//! The confirmation of an action: what it will do, and the form that does
//! it (with the sign-in's CSRF token). A page of its own, so confirming
//! needs no JavaScript.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::format::session_path;
use crate::model::Viewer;
use crate::pages::Signed;

#[component]
pub fn ConfirmPage() -> impl IntoView {
    view! { <Signed page=|viewer| view! { <Confirm viewer/> }/> }
}

#[component]
fn Confirm(viewer: Viewer) -> impl IntoView {
    let query = use_query_map();
    let get = move |name: &str| query.read().get(name).unwrap_or_default();
    if !viewer.may_act() {
        return view! {
            <p class="error" id="forbidden">
                {viewer.name.clone()} " is a " {viewer.role.as_str()} ": actions need the operator role."
            </p>
        }
        .into_any();
    }
    let csrf = viewer.csrf.clone();
    match get("action").as_str() {
        "drain" => {
            let replica = get("replica");
            view! {
                <h1>"Drain " {replica.clone()} "?"</h1>
                <p>"It stops taking new turns; the turns it runs finish (or are handed over at its drain timeout). "
                   "The front door sends new turns to the other replicas. It stays drained until it is replaced."</p>
                <form method="post" action="/dashboard/actions/drain">
                    <input type="hidden" name="replica" value=replica/>
                    <input type="hidden" name="csrf" value=csrf/>
                    <button id="confirm" class="danger" type="submit">"Drain"</button>
                    " " <a href="/dashboard/replicas">"Cancel"</a>
                </form>
            }
            .into_any()
        }
        "takeover" => {
            let (tenant, session) = (get("tenant"), get("session"));
            let back = session_path(&tenant, &session);
            view! {
                <h1>"Take over " {session.clone()} "?"</h1>
                <p>"Whoever holds its lease is fenced out: its commit will be refused (LEASE_LOST) and the "
                   "session's next turn runs at once on any replica, without waiting for the lease to expire."</p>
                <form method="post" action="/dashboard/actions/takeover">
                    <input type="hidden" name="tenant" value=tenant/>
                    <input type="hidden" name="session" value=session/>
                    <input type="hidden" name="csrf" value=csrf/>
                    <button id="confirm" class="danger" type="submit">"Take over"</button>
                    " " <a href=back>"Cancel"</a>
                </form>
            }
            .into_any()
        }
        "interrupt" => {
            let (tenant, session, turn) = (get("tenant"), get("session"), get("turn"));
            let back = session_path(&tenant, &session);
            view! {
                <h1>"Stop turn " {turn.clone()} " of " {session.clone()} "?"</h1>
                <p>"The replica that runs it closes the agent's request within a quarter of a second. Nothing "
                   "the turn did commits: the session stays at the version before it, its workspace files are "
                   "discarded, and its client is told INTERRUPTED. Its input stays in the history, marked "
                   "interrupted. If the turn has ended by then, nothing is stopped."</p>
                <form method="post" action="/dashboard/actions/interrupt">
                    <input type="hidden" name="tenant" value=tenant/>
                    <input type="hidden" name="session" value=session/>
                    <input type="hidden" name="turn" value=turn/>
                    <input type="hidden" name="csrf" value=csrf/>
                    <button id="confirm" class="danger" type="submit">"Stop the turn"</button>
                    " " <a href=back>"Cancel"</a>
                </form>
            }
            .into_any()
        }
        other => view! { <p class="error">"action: " {format!("{other:?}")} " is not one of drain, takeover, interrupt"</p> }
            .into_any(),
    }
}
