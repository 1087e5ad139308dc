//! What the dashboard does, as plain HTML form posts (they work without
//! JavaScript): sign in and out, drain a replica, take over a session, stop
//! a running turn; and
//! the workspace file downloads. Each action checks the role and the CSRF
//! token, is audited, and answers with a redirect to the page that shows
//! its result (`?done=<audit id>`). Refusals are JSON naming the rule.

use crate::server::error::{PageError, refuse};
use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use crate::format::{session_path, url_encode};
use crate::model::Viewer;
use crate::server::sidecars::SidecarError;
use crate::server::{Dashboard, auth, data};

/// Why an action was refused before it was tried.
struct Refusal(StatusCode, &'static str, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        refuse(self.0, self.1, self.2)
    }
}

/// How an action's caller proves who they are.
pub enum Proof<'a> {
    /// A dashboard form: the sign-in's cookie (the viewer the sign-in
    /// middleware found) and the form's CSRF token.
    Form {
        viewer: Option<&'a Viewer>,
        csrf: &'a str,
    },
    /// An API client (`baton dev rollout`, a script): a dashboard token in
    /// `Authorization: Bearer`, or nothing on an open (loopback) dashboard
    /// when no browser sent it (no `Origin` from another site).
    Api,
}

/// The one gate of every action: the caller is known, holds the operator
/// role, and (for a form) sent its sign-in's CSRF token. A refusal is
/// audited like an action (who tried what, and why not) and answered in
/// the JSON error shape.
pub async fn authorize(
    dashboard: &Dashboard,
    headers: &HeaderMap,
    proof: Proof<'_>,
    action: &str,
    target: &str,
) -> Result<Viewer, Response> {
    let decided = match proof {
        Proof::Form { viewer, csrf } => may_act(viewer).and_then(|viewer| {
            if !dashboard.auth.csrf_matches(&viewer, csrf) {
                Err((
                    viewer.name.clone(),
                    Refusal(
                        StatusCode::FORBIDDEN,
                        "FORBIDDEN",
                        "csrf: the form's token is missing or not this sign-in's; reload the page and try again"
                            .into(),
                    ),
                ))
            } else {
                Ok(viewer.clone())
            }
        }),
        Proof::Api => match dashboard.auth.bearer_viewer(headers) {
            Ok(Some(viewer)) => may_act(Some(&viewer)),
            Ok(None) => may_act(dashboard.auth.viewer(headers).as_ref().filter(|v| v.open)),
            Err(e) => Err((
                "unknown token".to_owned(),
                Refusal(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", e),
            )),
        },
    };
    match decided {
        Ok(viewer) => Ok(viewer),
        Err((who, refusal)) => {
            dashboard
                .audit(
                    &who,
                    action,
                    target,
                    Err(PageError::Refused(refusal.2.clone())),
                )
                .await;
            Err(refusal.into_response())
        }
    }
}

/// The viewer may act (signed in, operator role); a refusal names who
/// tried, for the audit log.
fn may_act(viewer: Option<&Viewer>) -> Result<Viewer, (String, Refusal)> {
    let Some(viewer) = viewer else {
        return Err((
            "anonymous".to_owned(),
            Refusal(
                StatusCode::UNAUTHORIZED,
                "UNAUTHENTICATED",
                "sign in first (or send `Authorization: Bearer <dashboard token>`)".into(),
            ),
        ));
    };
    if !viewer.may_act() {
        return Err((
            viewer.name.clone(),
            Refusal(
                StatusCode::FORBIDDEN,
                "FORBIDDEN",
                format!(
                    "{} is a {}: actions need the operator role",
                    viewer.name,
                    viewer.role.as_str()
                ),
            ),
        ));
    }
    Ok(viewer.clone())
}

#[derive(Deserialize)]
pub struct SignInForm {
    #[serde(default)]
    token: String,
}

pub async fn sign_in(
    State(dashboard): State<Arc<Dashboard>>,
    client: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Response {
    let client = client.map(|c| c.0.0.ip().to_canonical());
    match dashboard.auth.sign_in(form.token.trim(), client) {
        Ok(id) => {
            let mut response = Redirect::to("/dashboard").into_response();
            response
                .headers_mut()
                .insert(header::SET_COOKIE, auth::set_cookie(&id, &headers));
            response
        }
        Err(auth::SignInRefused::Unknown) => {
            Redirect::to("/dashboard/signin?failed=1").into_response()
        }
        Err(auth::SignInRefused::TooMany(wait)) => {
            let seconds = wait.as_secs().max(1);
            let mut response = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "TOO_MANY_REQUESTS",
                format!("too many failed sign-ins from this address; try again in {seconds} s"),
            );
            if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
            response
        }
    }
}

pub async fn sign_out(State(dashboard): State<Arc<Dashboard>>, headers: HeaderMap) -> Response {
    dashboard.auth.sign_out(&headers);
    let mut response = Redirect::to("/dashboard/signin").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, auth::clear_cookie());
    response
}

#[derive(Deserialize)]
pub struct DrainForm {
    #[serde(default)]
    replica: String,
    #[serde(default)]
    csrf: String,
}

pub async fn drain(
    State(dashboard): State<Arc<Dashboard>>,
    viewer: Option<axum::Extension<Viewer>>,
    headers: HeaderMap,
    Form(form): Form<DrainForm>,
) -> Response {
    let proof = Proof::Form {
        viewer: viewer.as_deref(),
        csrf: &form.csrf,
    };
    let viewer = match authorize(&dashboard, &headers, proof, "drain", &form.replica).await {
        Ok(v) => v,
        Err(refused) => return refused,
    };
    let outcome = async {
        let replica = data::find_replica(&dashboard, &form.replica).await?;
        let status = dashboard.sidecars.drain(&replica, &viewer.name).await?;
        Ok::<_, PageError>(format!("draining; {} turn(s) in flight", status.in_flight))
    }
    .await;
    let entry = dashboard
        .audit(&viewer.name, "drain", &form.replica, outcome)
        .await;
    Redirect::to(&format!("/dashboard/replicas?done={}", entry.id)).into_response()
}

#[derive(Deserialize)]
pub struct TakeoverForm {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    session: String,
    #[serde(default)]
    csrf: String,
}

pub async fn takeover(
    State(dashboard): State<Arc<Dashboard>>,
    viewer: Option<axum::Extension<Viewer>>,
    headers: HeaderMap,
    Form(form): Form<TakeoverForm>,
) -> Response {
    let target = format!("{}/{}", form.tenant, form.session);
    let proof = Proof::Form {
        viewer: viewer.as_deref(),
        csrf: &form.csrf,
    };
    let viewer = match authorize(&dashboard, &headers, proof, "takeover", &target).await {
        Ok(v) => v,
        Err(refused) => return refused,
    };
    let outcome = async {
        let key = data::session_key(&form.tenant, &form.session)?;
        let (tenant, session, actor) = (&form.tenant, &form.session, &viewer.name);
        let sidecars = &dashboard.sidecars;
        let taken = on_any_replica(&dashboard, |via| async move {
            sidecars.takeover(&via, tenant, session, actor).await
        })
        .await?;
        let fence = dashboard
            .catalog
            .inspect(&key)
            .await?
            .map_or(0, |v| v.fence);
        Ok::<_, PageError>(match taken.revoked_owner {
            Some(owner) => format!("fenced out {owner}; the fence is now {fence}"),
            None => format!("no turn held it; the fence is now {fence}"),
        })
    }
    .await;
    let entry = dashboard
        .audit(&viewer.name, "takeover", &target, outcome)
        .await;
    back_to_session(&form.tenant, &form.session, entry.id)
}

/// Calls `act` on each live replica in turn until one does it, those not
/// draining first. Any replica can do what the store does (revoke a lease,
/// interrupt a turn), and the lease's holder may be the one that hangs
/// (often why one acts at all).
async fn on_any_replica<T, F, Fut>(dashboard: &Dashboard, act: F) -> Result<T, PageError>
where
    F: Fn(baton_views::ReplicaView) -> Fut,
    Fut: std::future::Future<Output = Result<T, SidecarError>>,
{
    let mut replicas = dashboard.catalog.replicas().await?;
    replicas.retain(|r| r.info.url.is_some());
    replicas.sort_by_key(|r| r.info.draining);
    if replicas.is_empty() {
        return Err(PageError::NoReplicaToCall);
    }
    let mut failures = Vec::new();
    for via in replicas {
        match act(via).await {
            Ok(done) => return Ok(done),
            Err(e) => failures.push(e),
        }
    }
    Err(PageError::Sidecars(failures))
}

#[derive(Deserialize)]
pub struct InterruptForm {
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    session: String,
    #[serde(default)]
    turn: String,
    #[serde(default)]
    csrf: String,
}

/// The session page's Stop: interrupts the turn the page showed running
/// (that turn only: a later one is not stopped by a click meant for
/// another). Its replica drops the agent's request; nothing it did
/// commits; its client is told INTERRUPTED.
pub async fn interrupt(
    State(dashboard): State<Arc<Dashboard>>,
    viewer: Option<axum::Extension<Viewer>>,
    headers: HeaderMap,
    Form(form): Form<InterruptForm>,
) -> Response {
    let target = format!("{}/{} turn {}", form.tenant, form.session, form.turn);
    let proof = Proof::Form {
        viewer: viewer.as_deref(),
        csrf: &form.csrf,
    };
    let viewer = match authorize(&dashboard, &headers, proof, "interrupt", &target).await {
        Ok(v) => v,
        Err(refused) => return refused,
    };
    let outcome = async {
        data::session_key(&form.tenant, &form.session)?;
        let turn_seq = form
            .turn
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                PageError::Input(format!(
                    "turn: {:?} is not a turn number (1, 2, ...)",
                    form.turn.chars().take(40).collect::<String>()
                ))
            })?;
        let (tenant, session, actor) = (&form.tenant, &form.session, &viewer.name);
        let sidecars = &dashboard.sidecars;
        let stopped = on_any_replica(&dashboard, |via| async move {
            sidecars
                .interrupt(&via, tenant, session, turn_seq, actor)
                .await
        })
        .await?;
        Ok::<_, PageError>(match stopped {
            Some(s) => format!(
                "stopped turn {} (attempt {}) on {}; nothing it did commits",
                s.turn_seq, s.attempt, s.owner
            ),
            None => format!("turn {turn_seq} was not running: nothing to stop"),
        })
    }
    .await;
    let entry = dashboard
        .audit(&viewer.name, "interrupt", &target, outcome)
        .await;
    back_to_session(&form.tenant, &form.session, entry.id)
}

/// Where an action on a session returns: the session's page with the
/// action's audit id (the dashboard when the ids were not valid).
fn back_to_session(tenant: &str, session: &str, done: u64) -> Response {
    let back = if data::session_key(tenant, session).is_ok() {
        session_path(tenant, session)
    } else {
        "/dashboard".into()
    };
    Redirect::to(&format!("{back}?done={done}")).into_response()
}

#[derive(Deserialize)]
pub struct FileQuery {
    #[serde(default)]
    download: bool,
}

/// A file of the session's current workspace, as text to view or as an
/// attachment. Served so a browser can never run it: no sniffing, and a
/// sandbox with nothing allowed.
pub async fn file(
    State(dashboard): State<Arc<Dashboard>>,
    Path((tenant, session, name)): Path<(String, String, String)>,
    Query(query): Query<FileQuery>,
) -> Response {
    let key = match data::session_key(&tenant, &session) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let Some(workspaces) = &dashboard.workspaces else {
        return refuse(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "the dashboard was not given the workspace store".into(),
        );
    };
    let reference = match dashboard.catalog.inspect(&key).await {
        Ok(Some(view)) => view.workspace,
        Ok(None) => None,
        Err(e) => return e.into_response(),
    };
    let Some(reference) = reference else {
        return refuse(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("session {key} has no workspace files"),
        );
    };
    let bytes = match workspaces.read_file(&reference, &name).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return refuse(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                format!("file: {name:?} is not in session {key}'s current workspace"),
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "dashboard: reading a workspace file failed");
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "UNAVAILABLE",
                "file: the object store did not answer".into(),
            );
        }
    };
    let text = std::str::from_utf8(&bytes).is_ok();
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if text {
            "text/plain; charset=utf-8"
        } else {
            "application/octet-stream"
        }),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    if query.download || !text {
        let file_name = name.rsplit('/').next().unwrap_or(&name);
        if let Ok(v) = HeaderValue::from_str(&format!(
            "attachment; filename*=UTF-8''{}",
            url_encode(file_name)
        )) {
            headers.insert(header::CONTENT_DISPOSITION, v);
        }
    }
    response
}
