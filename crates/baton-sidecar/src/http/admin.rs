//! The admin API (drain, status, takeover: admin tokens only), probes and
//! metrics.

use super::*;
use crate::outcome::Outcome;

/// The admin API is for operators: with authentication on it needs an
/// admin token (a tenant's token is not one).
pub(super) fn admin<S>(api: &Api<S>, headers: &HeaderMap) -> ApiResult<()> {
    api.auth.admin(headers)?;
    Ok(())
}

pub(super) fn status<S: TurnStore + 'static>(engine: &Engine<S>) -> ReplicaStatus {
    let turns = engine.inflight.snapshot();
    ReplicaStatus {
        replica: engine.replica.clone(),
        holder: engine.holder.to_string(),
        draining: engine.inflight.is_draining(),
        ready: !engine.inflight.is_draining() && engine.stores_answer(),
        in_flight: turns.len() as u64,
        turns,
        oldest_unshipped_ms: engine.store.oldest_unshipped_ms(),
        turn_latency: engine.metrics.latency_counts(),
        aborted_by_drain: engine.inflight.aborted(),
        drained_in_ms: engine.inflight.drained_in_ms(),
        unreleased_leases: engine.inflight.unreleased_count() as u64,
        layout: Some(engine.layout),
        store_layout: engine.layout_mismatch(),
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct DrainQuery {
    #[serde(default)]
    wait: bool,
}

pub(super) async fn post_drain<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Query(query): Query<DrainQuery>,
    headers: HeaderMap,
) -> ApiResult<(StatusCode, Json<ReplicaStatus>)> {
    admin(&api, &headers)?;
    api.engine.start_drain();
    if query.wait {
        api.engine.drained().await;
        return Ok((StatusCode::OK, Json(status(&api.engine))));
    }
    Ok((StatusCode::ACCEPTED, Json(status(&api.engine))))
}

/// kubelet's preStop hook: drain, and answer once no turn runs. The
/// kubelet cannot send a secret with an httpGet hook, so a call from the
/// pod's node (or from inside the pod) needs no token; anyone else needs an
/// admin token, as for a drain.
pub(super) async fn prestop<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<crate::runtimes::Peer>>>,
    headers: HeaderMap,
) -> ApiResult<Json<ReplicaStatus>> {
    let from_node = peer.is_some_and(|p| {
        let ip = p.0.0.0.ip().to_canonical();
        ip.is_loopback() || api.node_ip == Some(ip)
    });
    if !from_node {
        admin(&api, &headers)?;
    }
    api.engine.start_drain();
    api.engine.drained().await;
    Ok(Json(status(&api.engine)))
}

pub(super) async fn get_status<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    headers: HeaderMap,
) -> ApiResult<Json<ReplicaStatus>> {
    admin(&api, &headers)?;
    Ok(Json(status(&api.engine)))
}

/// After a drain: gives back every lease the replica could not release when
/// its turns ended, so no session waits for a lease TTL. The rollout calls
/// it before deleting the pod.
pub(super) async fn post_handover<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    headers: HeaderMap,
) -> ApiResult<Json<Handover>> {
    admin(&api, &headers)?;
    if !api.engine.inflight.is_draining() || !api.engine.inflight.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Outcome::NotDrained,
            "drain the replica first (POST /v1/admin/drain) and wait until no turn runs",
        ));
    }
    let (released, still_held) = api.engine.hand_over().await;
    tracing::info!(released, still_held, "handover");
    Ok(Json(Handover {
        released,
        still_held,
    }))
}

/// Takeover is an operator's act (the rollout, the dashboard): it fences
/// out whoever holds the session, so it needs an admin token, and names the
/// tenant in the path since an admin token belongs to no tenant.
pub(super) async fn post_takeover<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
    Path((tenant, session)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Takeover>> {
    admin(&api, &headers)?;
    let tenant = TenantId::new(tenant)
        .map_err(|e| ApiError::bad_request(format!("tenant: {e}")).with("field", "tenant"))?;
    let session = SessionId::new(session)
        .map_err(|e| ApiError::bad_request(format!("session id: {e}")).with("field", "session"))?;
    let key = SessionKey { tenant, session };
    let revoked = api.engine.store.revoke(&key).await?;
    tracing::info!(session = %key, revoked = ?revoked, "takeover");
    Ok(Json(Takeover {
        tenant: key.tenant.to_string(),
        session: key.session.to_string(),
        revoked_owner: revoked,
    }))
}

pub(super) async fn readyz<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
) -> ApiResult<&'static str> {
    if api.engine.inflight.is_draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Draining,
            "this replica is draining",
        ));
    }
    if let Some(store) = api.engine.layout_mismatch() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::LayoutMismatch,
            format!(
                "this replica writes data layout {} but the stores hold layout {store}",
                api.engine.layout
            ),
        ));
    }
    if !api.engine.stores_answer() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::StoreUnavailable,
            "the stores did not answer the last heartbeats",
        ));
    }
    if !api.engine.agent.reachable().await {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::AgentUnavailable,
            "the agent does not accept connections",
        ));
    }
    Ok("ready\n")
}

pub(super) async fn metrics<S: TurnStore + SessionCatalog + 'static>(
    State(api): State<Arc<Api<S>>>,
) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        api.engine.metrics.encode(),
    )
}
