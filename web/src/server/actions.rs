//! What the dashboard does, as plain HTML form posts (they work without
//! JavaScript): sign in and out, drain a replica, take over a session; and
//! the workspace file downloads. Each action checks the role and the CSRF
//! token, is audited, and answers with a redirect to the page that shows
//! its result (`?done=<audit id>`). Refusals are JSON naming the rule.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::json;

use crate::format::{session_path, url_encode};
use crate::model::Viewer;
use crate::server::{Dashboard, auth, data};

fn refuse(status: StatusCode, outcome: &str, error: String) -> Response {
    (
        status,
        axum::Json(json!({ "status": outcome, "error": error })),
    )
        .into_response()
}

/// Why an action was refused before it was tried.
struct Refusal(StatusCode, &'static str, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        refuse(self.0, self.1, self.2)
    }
}

/// The viewer may act, and the form is theirs.
fn check(viewer: Option<&Viewer>, csrf: &str) -> Result<Viewer, Refusal> {
    let Some(viewer) = viewer else {
        return Err(Refusal(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            "sign in first".into(),
        ));
    };
    if !viewer.may_act() {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            format!(
                "{} is a {}: actions need the operator role",
                viewer.name,
                viewer.role.as_str()
            ),
        ));
    }
    if csrf.is_empty() || csrf != viewer.csrf {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            "csrf: the form's token is missing or not this sign-in's; reload the page and try again"
                .into(),
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
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Response {
    match dashboard.auth.sign_in(form.token.trim()) {
        Some(id) => {
            let mut response = Redirect::to("/dashboard").into_response();
            response
                .headers_mut()
                .insert(header::SET_COOKIE, auth::set_cookie(&id, &headers));
            response
        }
        None => Redirect::to("/dashboard/signin?failed=1").into_response(),
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
    Form(form): Form<DrainForm>,
) -> Response {
    let viewer = match check(viewer.as_deref(), &form.csrf) {
        Ok(v) => v,
        Err(refusal) => return refusal.into_response(),
    };
    let outcome = async {
        let replica = data::find_replica(&dashboard, &form.replica).await?;
        let status = dashboard.sidecars.drain(&replica).await?;
        Ok::<_, String>(format!("draining; {} turn(s) in flight", status.in_flight))
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
    Form(form): Form<TakeoverForm>,
) -> Response {
    let viewer = match check(viewer.as_deref(), &form.csrf) {
        Ok(v) => v,
        Err(refusal) => return refusal.into_response(),
    };
    let target = format!("{}/{}", form.tenant, form.session);
    let outcome = async {
        let key = data::session_key(&form.tenant, &form.session)?;
        // Any replica can revoke: the lease lives in the store. The holder
        // may be the one that hangs (that is why one takes over), so each
        // live replica is tried in turn, those not draining first.
        let mut replicas = dashboard.catalog.replicas().await?;
        replicas.retain(|r| r.info.url.is_some());
        replicas.sort_by_key(|r| r.info.draining);
        if replicas.is_empty() {
            return Err(
                "no live replica advertises its address, so none can take the session over"
                    .to_owned(),
            );
        }
        let mut failures = Vec::new();
        let mut taken = None;
        for via in &replicas {
            match dashboard
                .sidecars
                .takeover(via, &form.tenant, &form.session)
                .await
            {
                Ok(t) => {
                    taken = Some(t);
                    break;
                }
                Err(e) => failures.push(e),
            }
        }
        let taken = taken.ok_or_else(|| failures.join("; "))?;
        let fence = dashboard
            .catalog
            .inspect(&key)
            .await?
            .map_or(0, |v| v.fence);
        Ok::<_, String>(match taken.revoked_owner {
            Some(owner) => format!("fenced out {owner}; the fence is now {fence}"),
            None => format!("no turn held it; the fence is now {fence}"),
        })
    }
    .await;
    let entry = dashboard
        .audit(&viewer.name, "takeover", &target, outcome)
        .await;
    let back = if data::session_key(&form.tenant, &form.session).is_ok() {
        session_path(&form.tenant, &form.session)
    } else {
        "/dashboard".into()
    };
    Redirect::to(&format!("{back}?done={}", entry.id)).into_response()
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
        Err(e) => return refuse(StatusCode::BAD_REQUEST, "BAD_REQUEST", e),
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
        Err(e) => return refuse(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", e),
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
