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

/// Longest actor name kept for the log.
const MAX_ACTOR_CHARS: usize = 128;

/// Who an authorised admin call acts for, for the log: the caller's
/// `x-baton-actor` (control characters dropped, cut at 128 characters),
/// else what let it in.
pub(super) fn actor<S>(api: &Api<S>, headers: &HeaderMap) -> String {
    let said = headers
        .get(baton_api::constants::headers::ACTOR)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.chars()
                .filter(|c| !c.is_control())
                .take(MAX_ACTOR_CHARS)
                .collect::<String>()
        })
        .filter(|v| !v.trim().is_empty());
    let credential = if api.auth.is_off() {
        "no token: authentication is off"
    } else {
        "an admin token"
    };
    match said {
        Some(name) => format!("{name} (with {credential})"),
        None => format!("unnamed caller (with {credential})"),
    }
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

pub(super) async fn post_drain<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Query(query): Query<DrainQuery>,
    headers: HeaderMap,
) -> ApiResult<(StatusCode, Json<ReplicaStatus>)> {
    admin(&api, &headers)?;
    api.engine.start_drain(&actor(&api, &headers));
    if query.wait {
        api.engine.drained().await;
        return Ok((StatusCode::OK, Json(status(&api.engine))));
    }
    Ok((StatusCode::ACCEPTED, Json(status(&api.engine))))
}

/// The agent container's preStop hook: answers once this replica has
/// drained, so the kubelet stops the agent only after the sidecar finished
/// the turns that call it. It waits for a drain to start (the sidecar's
/// SIGTERM starts one) but never starts one itself: a GET changes nothing,
/// so it needs no token, and no address is trusted to drain (the node's
/// address is also what any client looks like after a NodePort's SNAT).
/// The wait is bounded by the drain timeout plus the time aborted turns
/// take to leave; past it the answer is 503 NOT_DRAINED.
pub(super) async fn drained<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
) -> ApiResult<&'static str> {
    let engine = &api.engine;
    let limit = engine.drain_wait_limit();
    let waited = tokio::time::timeout(limit, async {
        engine.inflight.drain_started().await;
        engine.drained().await;
    })
    .await;
    match waited {
        Ok(()) => Ok("drained\n"),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::NotDrained,
            format!(
                "this replica has not drained within {limit:?} (a drain starts at SIGTERM or POST {})",
                paths::DRAIN
            ),
        )),
    }
}

pub(super) async fn get_status<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    headers: HeaderMap,
) -> ApiResult<Json<ReplicaStatus>> {
    admin(&api, &headers)?;
    Ok(Json(status(&api.engine)))
}

/// After a drain: gives back every lease the replica could not release when
/// its turns ended, so no session waits for a lease TTL. The rollout calls
/// it before deleting the pod.
pub(super) async fn post_handover<S: ApiStore>(
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
    tracing::info!(released, still_held, requested_by = %actor(&api, &headers), "handover");
    Ok(Json(Handover {
        released,
        still_held,
    }))
}

/// Takeover is an operator's act (the rollout, the dashboard): it fences
/// out whoever holds the session, so it needs an admin token, and names the
/// tenant in the path since an admin token belongs to no tenant.
pub(super) async fn post_takeover<S: ApiStore>(
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
    tracing::info!(session = %key, revoked = ?revoked, requested_by = %actor(&api, &headers), "takeover");
    Ok(Json(Takeover {
        tenant: key.tenant.to_string(),
        session: key.session.to_string(),
        revoked_owner: revoked,
    }))
}

#[derive(Debug, Default, Deserialize)]
pub struct AdminInterruptQuery {
    /// Only this turn (the one the dashboard showed): a later turn that
    /// started meanwhile is not stopped by a click meant for another.
    #[serde(rename = "turnSeq")]
    turn_seq: Option<String>,
}

/// `POST /v1/admin/tenants/{tenant}/sessions/{session}/interrupt`: the
/// dashboard's Stop, for the turn that runs on the session (`?turnSeq=`:
/// only that one).
pub(super) async fn post_admin_interrupt<S: ApiStore>(
    State(api): State<Arc<Api<S>>>,
    Path((tenant, session)): Path<(String, String)>,
    Query(query): Query<AdminInterruptQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Interrupted>> {
    admin(&api, &headers)?;
    let tenant = TenantId::new(tenant)
        .map_err(|e| ApiError::bad_request(format!("tenant: {e}")).with("field", "tenant"))?;
    let session = SessionId::new(session)
        .map_err(|e| ApiError::bad_request(format!("session id: {e}")).with("field", "session"))?;
    let turn_seq = query
        .turn_seq
        .as_deref()
        .map(|n| super::rejoin::parse_turn_seq("query", n))
        .transpose()?;
    let by = actor(&api, &headers);
    super::turns::interrupt(&api, SessionKey { tenant, session }, turn_seq, &by).await
}

pub(super) async fn readyz<S: ApiStore>(State(api): State<Arc<Api<S>>>) -> ApiResult<&'static str> {
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

pub(super) async fn metrics<S: ApiStore>(State(api): State<Arc<Api<S>>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        api.engine.metrics.encode(),
    )
}
