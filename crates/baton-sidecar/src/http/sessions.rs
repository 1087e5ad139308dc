//! Reading a session: its view (version, lease, recent turns, state) and
//! the files of its committed workspace.

use super::*;
use crate::outcome::Outcome;

#[derive(Debug, Default, Deserialize)]
pub struct SessionQuery {
    #[serde(default)]
    state: bool,
}

pub(super) async fn get_session<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Path(session): Path<String>,
    Query(query): Query<SessionQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<SessionView>> {
    let key = api.key(&headers, &session)?;
    let store = &api.engine.store;
    let Some(view) = store.session(&key).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            Outcome::NotFound,
            format!("session {key} has no state"),
        ));
    };
    let turns = store.turns(&key, RECENT_TURNS).await?;
    let state = if query.state {
        store.read_state(&key).await?.map(|s| StateView {
            version: s.version,
            payload: if s.payload.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice::<Value>(&s.payload).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&s.payload).into_owned())
                })
            },
        })
    } else {
        None
    };
    Ok(Json(view.to_view(&turns, state)))
}

/// The committed workspace reference of `key`, or 404.
pub(super) async fn committed_workspace<S: TurnStore>(
    engine: &Engine<S>,
    key: &SessionKey,
) -> ApiResult<(u64, Option<String>)> {
    match engine.store.read_state(key).await? {
        Some(s) => Ok((s.version, s.workspace)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            Outcome::NotFound,
            format!("session {key} has no state"),
        )),
    }
}

pub(super) async fn list_files<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Path(session): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<FileList>> {
    let key = api.key(&headers, &session)?;
    let (version, reference) = committed_workspace(&api.engine, &key).await?;
    let files = match &reference {
        Some(r) => api
            .engine
            .workspaces
            .load_manifest(r)
            .await
            .map_err(TurnError::from)?
            .files
            .into_iter()
            .map(|(name, f)| {
                let view = FileView {
                    size: f.size,
                    sha256: f.blob,
                };
                (name, view)
            })
            .collect(),
        None => BTreeMap::new(),
    };
    Ok(Json(FileList { version, files }))
}

pub(super) async fn get_file<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Path((session, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let key = api.key(&headers, &session)?;
    let (_, reference) = committed_workspace(&api.engine, &key).await?;
    let missing = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            Outcome::NotFound,
            format!("session {key} has no file {name:?}"),
        )
    };
    let reference = reference.ok_or_else(missing)?;
    let content = api
        .engine
        .workspaces
        .read_file(&reference, &name)
        .await
        .map_err(TurnError::from)?
        .ok_or_else(missing)?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        content,
    )
        .into_response())
}
