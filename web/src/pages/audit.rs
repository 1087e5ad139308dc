//! Every action taken from the dashboard: who, what, when, how it ended.

use leptos::prelude::*;

use crate::format::clock;
use crate::pages::{Signed, error_text, load_audit};

#[component]
pub fn AuditPage() -> impl IntoView {
    view! { <Signed page=|_viewer| view! { <Audit/> }/> }
}

#[component]
fn Audit() -> impl IntoView {
    let entries = Resource::new(|| (), |_| load_audit());
    view! {
        <h1>"Audit log"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match entries.await {
                    Ok(entries) if entries.is_empty() => {
                        view! { <p id="no-actions">"No action yet."</p> }.into_any()
                    }
                    Ok(entries) => {
                        let rows = entries
                            .into_iter()
                            .map(|e| {
                                let (class, outcome) = if e.ok { ("ok", "done") } else { ("failed", "failed") };
                                view! {
                                    <tr class="entry" data-id=e.id>
                                        <td class="num">{e.id}</td>
                                        <td>{clock(e.at_ms)}</td>
                                        <td class="who">{e.who}</td>
                                        <td class="action">{e.action}</td>
                                        <td class="target">{e.target}</td>
                                        <td class=class>{outcome}</td>
                                        <td class="detail">{e.detail}</td>
                                    </tr>
                                }
                            })
                            .collect_view();
                        view! {
                            <table id="audit">
                                <thead>
                                    <tr><th class="num">"#"</th><th>"when (UTC)"</th><th>"who"</th>
                                        <th>"action"</th><th>"target"</th><th>"result"</th><th>"detail"</th></tr>
                                </thead>
                                <tbody>{rows}</tbody>
                            </table>
                        }
                        .into_any()
                    }
                    Err(e) => view! { <p class="error">{error_text(&e)}</p> }.into_any(),
                }
            })}
        </Suspense>
    }
}
