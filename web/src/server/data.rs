//! What each page shows, read from the stores and the sidecars. The server
//! functions and the live updates both call these.

use std::collections::BTreeMap;

use baton_session::{ListQuery, SessionKey, TenantId};
use baton_views::{PageKey, ReplicaView, SessionSummary};
use futures::future::join_all;

use crate::model::{
    ClusterView, FileRow, Filters, OutputData, ReplicaRow, ReplicasData, SessionData, SessionRow,
    SessionsData,
};
use crate::server::error::PageError;
use crate::server::{Dashboard, PAGE_SIZE, TURN_HISTORY, now_ms};

/// Largest workspace file whose text the session page shows inline.
pub const INLINE_FILE_BYTES: u64 = 64 * 1024;

/// A key from the page's words, refused with the field's name.
pub fn session_key(tenant: &str, session: &str) -> Result<SessionKey, PageError> {
    SessionKey::new(tenant, session).map_err(|e| PageError::Input(e.to_string()))
}

fn tenant(value: &Option<String>) -> Result<Option<TenantId>, PageError> {
    value
        .as_deref()
        .map(TenantId::new)
        .transpose()
        .map_err(|e| PageError::Input(format!("tenant: {e}")))
}

pub async fn sessions(dashboard: &Dashboard, filters: &Filters) -> Result<SessionsData, PageError> {
    if filters.leased {
        return leased_sessions(dashboard, filters).await;
    }
    let after = match &filters.after {
        Some(PageKey { tenant, session }) => Some(
            session_key(tenant, session)
                .map_err(|e| PageError::Input(format!("after_tenant/after_session: {e}")))?,
        ),
        None => None,
    };
    let query = ListQuery {
        tenant: tenant(&filters.tenant)?,
        prefix: filters.prefix.clone(),
        replica: filters.replica.clone(),
        after,
        limit: PAGE_SIZE,
    };
    let page = dashboard.catalog.sessions(&query).await?.to_view();
    let keys: Vec<Result<SessionKey, PageError>> = page
        .sessions
        .iter()
        .map(|s| session_key(&s.tenant, &s.session))
        .collect();
    // One read per row, concurrently: on Redis they share one connection
    // and pipeline.
    let leases = join_all(keys.iter().map(|key| async move {
        match key {
            Ok(key) => dashboard.catalog.inspect(key).await,
            Err(e) => Err(PageError::Input(e.to_string())),
        }
    }))
    .await;
    let mut warnings = Vec::new();
    let rows = page
        .sessions
        .into_iter()
        .zip(leases)
        .map(|(summary, live)| {
            let lease = match live {
                Ok(view) => view.and_then(|v| v.lease),
                Err(e) => {
                    if warnings.is_empty() {
                        warnings.push(format!("leases: {e}"));
                    }
                    None
                }
            };
            SessionRow { summary, lease }
        })
        .collect();
    Ok(SessionsData {
        rows,
        next: page.next,
        now_ms: now_ms(),
        warnings,
    })
}

/// The sessions a turn holds now: the replicas' in-flight turns, with
/// each session's live view. A replica that does not answer is named
/// above the rows.
async fn leased_sessions(
    dashboard: &Dashboard,
    filters: &Filters,
) -> Result<SessionsData, PageError> {
    let replicas = replicas(dashboard).await?;
    let mut warnings = Vec::new();
    let mut held = BTreeMap::new();
    for row in &replicas.replicas {
        if let Some(e) = &row.error {
            warnings.push(e.clone());
        }
        for turn in row.turns() {
            held.insert((turn.tenant.clone(), turn.session.clone()), ());
        }
    }
    let wanted = |(tenant, session): &(String, String)| {
        filters.tenant.as_ref().is_none_or(|t| t == tenant)
            && filters
                .prefix
                .as_ref()
                .is_none_or(|p| session.starts_with(p.as_str()))
    };
    let keys: Vec<SessionKey> = held
        .keys()
        .filter(|k| wanted(k))
        .filter_map(|(t, s)| session_key(t, s).ok())
        .collect();
    let views = join_all(keys.iter().map(|k| dashboard.catalog.inspect(k))).await;
    let mut rows = Vec::new();
    for (key, view) in keys.iter().zip(views) {
        let view = match view {
            Ok(Some(view)) => view,
            Ok(None) => continue,
            Err(e) => {
                warnings.push(e.to_string());
                continue;
            }
        };
        if let Some(replica) = &filters.replica {
            let on = view.lease.as_ref().map(|l| l.owner.as_str());
            if !on.is_some_and(|o| o.starts_with(replica.as_str())) {
                continue;
            }
        }
        rows.push(SessionRow {
            summary: SessionSummary {
                tenant: key.tenant.to_string(),
                session: key.session.to_string(),
                version: view.version,
                last_turn_seq: view.last_turn_seq,
                last_replica: view.last_replica.clone(),
                last_turn_at_ms: view.updated_at_ms,
                // Turn sequence numbers count a session's turns from 1.
                turn_count: view.last_turn_seq,
            },
            lease: view.lease,
        });
    }
    Ok(SessionsData {
        rows,
        next: None,
        now_ms: now_ms(),
        warnings,
    })
}

pub async fn session(
    dashboard: &Dashboard,
    tenant: &str,
    session: &str,
    reveal_state: bool,
) -> Result<SessionData, PageError> {
    let key = session_key(tenant, session)?;
    let (view, turns) = futures::join!(
        dashboard.catalog.inspect(&key),
        dashboard.catalog.turns(&key, TURN_HISTORY)
    );
    let mut warnings = Vec::new();
    let turns = turns.unwrap_or_else(|e| {
        warnings.push(e.to_string());
        Vec::new()
    });
    let view = view?.map(|v| v.to_view(&turns, None));
    let mut files = Vec::new();
    if let Some(reference) = view.as_ref().and_then(|v| v.workspace.clone()) {
        match workspace_files(dashboard, &reference).await {
            Ok(f) => files = f,
            Err(e) => warnings.push(e.to_string()),
        }
    }
    let lease_held_ms = match view.as_ref().and_then(|v| v.lease.as_ref()) {
        // A holder that hangs (why one looks) must not hold the page up.
        Some(lease) => tokio::time::timeout(
            std::time::Duration::from_millis(500),
            held_for(dashboard, &lease.owner, tenant, session),
        )
        .await
        .ok()
        .flatten(),
        None => None,
    };
    let output = match view.as_ref().and_then(|v| v.lease.as_ref()) {
        Some(lease) => match crate::server::output::read(dashboard, &key, lease).await {
            Ok(output) => Some(output),
            Err(e) => {
                warnings.push(e.to_string());
                None
            }
        },
        None => None,
    };
    let state = if reveal_state && view.is_some() {
        dashboard
            .catalog
            .state(&key)
            .await?
            .map(|s| String::from_utf8_lossy(&s.payload).into_owned())
    } else {
        None
    };
    Ok(SessionData {
        tenant: tenant.to_owned(),
        session: session.to_owned(),
        view,
        files,
        state,
        lease_held_ms,
        output,
        now_ms: now_ms(),
        warnings,
    })
}

/// The session page's fast channel: the running turn's output alone.
pub async fn output(
    dashboard: &Dashboard,
    tenant: &str,
    session: &str,
) -> Result<OutputData, PageError> {
    let key = session_key(tenant, session)?;
    let lease = dashboard.catalog.inspect(&key).await?.and_then(|v| v.lease);
    let output = match lease {
        Some(lease) => Some(crate::server::output::read(dashboard, &key, &lease).await?),
        None => None,
    };
    Ok(OutputData { output })
}

/// How long `holder` has been running its turn of the session: its
/// sidecar's in-flight list says (the lease is granted as the turn starts).
async fn held_for(dashboard: &Dashboard, holder: &str, tenant: &str, session: &str) -> Option<u64> {
    let replicas = dashboard.catalog.replicas().await.ok()?;
    let replica = replicas.iter().find(|r| r.id == holder)?;
    let status = dashboard.sidecars.status(replica).await.ok()?;
    status
        .turns
        .iter()
        .find(|t| t.tenant == tenant && t.session == session)
        .map(|t| t.running_ms)
}

async fn workspace_files(
    dashboard: &Dashboard,
    reference: &str,
) -> Result<Vec<FileRow>, PageError> {
    let Some(workspaces) = &dashboard.workspaces else {
        return Err(PageError::Workspace(
            "workspace files: the dashboard was not given the workspace store",
        ));
    };
    let manifest = workspaces.load_manifest(reference).await.map_err(|e| {
        tracing::warn!(error = %e, "dashboard: reading a workspace manifest failed");
        PageError::Workspace("workspace files: the object store did not answer")
    })?;
    let mut rows = Vec::new();
    for (name, entry) in manifest.files {
        let text = if entry.size <= INLINE_FILE_BYTES {
            match workspaces.read_file(reference, &name).await {
                Ok(Some(bytes)) => String::from_utf8(bytes.to_vec()).ok(),
                _ => None,
            }
        } else {
            None
        };
        rows.push(FileRow {
            name,
            size: entry.size,
            sha256: entry.blob,
            text,
        });
    }
    Ok(rows)
}

pub async fn replicas(dashboard: &Dashboard) -> Result<ReplicasData, PageError> {
    let views: Vec<ReplicaView> = dashboard.catalog.replicas().await?;
    let statuses = join_all(views.iter().map(|v| dashboard.sidecars.status(v))).await;
    let now = now_ms();
    let live: Vec<&str> = views.iter().map(|v| v.id.as_str()).collect();
    dashboard.samples.retain(&live);
    let replicas = views
        .into_iter()
        .zip(statuses)
        .map(|(view, status)| {
            let (status, error) = match status {
                Ok(status) => {
                    dashboard
                        .samples
                        .record(&view.id, now, status.turn_latency.clone());
                    (Some(status), None)
                }
                Err(e) => (None, Some(e.to_string())),
            };
            ReplicaRow {
                recent: dashboard.samples.series(&view.id),
                view,
                status,
                error,
            }
        })
        .collect();
    let cluster = match &dashboard.cluster {
        Some(cluster) => Some(match cluster.deployments().await {
            Ok(deployments) => ClusterView {
                deployments,
                error: None,
            },
            Err(e) => ClusterView {
                deployments: Vec::new(),
                error: Some(e),
            },
        }),
        None => None,
    };
    Ok(ReplicasData {
        replicas,
        now_ms: now,
        cluster,
    })
}

/// The live replica whose name (or holder id) is `name`.
pub async fn find_replica(dashboard: &Dashboard, name: &str) -> Result<ReplicaView, PageError> {
    let views = dashboard.catalog.replicas().await?;
    views
        .into_iter()
        .find(|v| v.info.replica == name || v.id == name)
        .ok_or_else(|| PageError::NotFound(format!("replica: no live replica is named {name:?}")))
}
