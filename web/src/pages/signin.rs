//! Sign-in with a dashboard token.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

#[component]
pub fn SignInPage() -> impl IntoView {
    let query = use_query_map();
    let failed = move || query.read().get("failed").is_some();
    view! {
        <main>
            <h1>"Sign in to Baton"</h1>
            {move || failed().then(|| view! {
                <p class="error" id="signin-failed">"That token is not one of the dashboard's."</p>
            })}
            <form method="post" action="/dashboard/signin">
                <label>"Dashboard token " <input type="password" name="token" id="token" autocomplete="off"/></label>
                " "
                <button type="submit" id="signin">"Sign in"</button>
            </form>
            <p class="muted">"Tokens and their roles (viewer, operator) are in the dashboard's tokens file."</p>
        </main>
    }
}
