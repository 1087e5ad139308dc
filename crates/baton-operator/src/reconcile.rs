//! One reconcile of one `AgentDeployment`: read → validate → gather → build
//! → apply → prune → status. Only the edges talk to the API server; the
//! middle (validation, building, the apply and prune decisions, the status)
//! is pure and lives in `baton-api`, `baton-resources`, [`crate::children`]
//! and [`crate::status`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_api::constants::secret_keys;
use baton_api::validate::Dependency;
use baton_api::{
    AgentDeployment, AgentDeploymentStatus, RolloutPhase, RolloutStep, ValidAgentDeployment,
    condition_types,
};
use baton_resources::Credentials;
use baton_resources::meta::{App, selector_labels};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::error_boundary::{DeserializeGuard, InvalidObject};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{Instrument as _, info, warn};

use crate::apply;
use crate::caches::Caches;
use crate::children::{self, ChildKey, Verified};
use crate::leader::Leadership;
use crate::metrics::{Metrics, ResultLabel};
use crate::rollout::{self, DrainProbe, Plan, ReplicaPod};
use crate::rollout_io::{self, Sidecars};
use crate::status::{self, Observed, Problem, ReplicaObservation, StoreObservation};

/// How long a reconcile waits for the watch caches to be filled.
const CACHE_WAIT: Duration = Duration::from_secs(10);
/// How soon a resource waiting for an external Secret is checked again.
const WAIT_FOR_SECRET: Duration = Duration::from_secs(3);
/// Backoff after a failed reconcile: doubles from the first to the cap.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(120);

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub caches: Caches,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The sidecar image for resources that do not name one.
    pub default_sidecar_image: Option<String>,
    /// What the operator's settings add to every deployment's objects.
    pub platform: baton_resources::Platform,
    /// How often an unchanged, healthy resource is checked again.
    pub resync: Duration,
    pub verified: Mutex<Verified>,
    pub failures: Mutex<HashMap<ObjectRef<DeserializeGuard<AgentDeployment>>, u32>>,
    /// Calls the sidecars' admin API (drain, handover) during a rollout.
    pub sidecars: Sidecars,
    /// Whether this instance may write (the leader, within its deadline).
    pub leadership: Leadership,
}

impl Context {
    /// Every write to the API server (and every drain of a pod) asks here
    /// first: only a leader within its renewal deadline writes. Counted.
    pub fn write(&self, verb: &'static str) -> Result<(), Error> {
        self.leading(verb)?;
        self.metrics.write(verb);
        Ok(())
    }

    /// The leadership check alone, for acts that are not API writes
    /// (asking a sidecar to drain again).
    pub fn leading(&self, what: &'static str) -> Result<(), Error> {
        if self.leadership.may_write() {
            return Ok(());
        }
        self.metrics.refused_writes.inc();
        warn!(what, "not the leader within its renewal deadline: refused");
        Err(Error::NotLeader)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("applying {child}: {source}")]
    Apply {
        child: ChildKey,
        source: kube::Error,
    },
    #[error("pruning {child}: {source}")]
    Prune {
        child: ChildKey,
        source: kube::Error,
    },
    #[error(
        "the watches of {} have not delivered a first list; is list/watch on them missing from the operator's role (baton operator rbac)?",
        .0.join(", ")
    )]
    WatchNotReady(Vec<&'static str>),
    #[error("this instance is not the leader within its renewal deadline")]
    NotLeader,
}

/// The status time: whole seconds, as the API server stores it, so that a
/// status read back compares equal to the one written.
fn now() -> Time {
    rollout::time(Timestamp::now())
}

pub async fn reconcile(
    object: Arc<DeserializeGuard<AgentDeployment>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let result = if tokio::time::timeout(CACHE_WAIT, ctx.caches.wait_until_ready())
        .await
        .is_err()
    {
        let kinds = ctx.caches.unready_kinds();
        let error = Error::WatchNotReady(kinds);
        if let Ok(agd) = &object.0 {
            report_problem(agd, None, &ctx, "WatchNotReady", &error).await;
        }
        Err(error)
    } else {
        match &object.0 {
            Ok(agd) => reconcile_resource(agd, &ctx).await,
            Err(invalid) => report_malformed(invalid, &ctx).await,
        }
    };
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    ctx.caches.report(&ctx.metrics);
    let label = match &result {
        Ok((_, outcome)) => *outcome,
        Err(_) => "error",
    };
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabel { result: label })
        .inc();
    if result.is_ok() {
        ctx.failures
            .lock()
            .expect("failures lock")
            .remove(&ObjectRef::from_obj(object.as_ref()));
    }
    result.map(|(action, _)| action)
}

/// Requeue with a backoff that doubles per consecutive failure.
pub fn error_policy(
    object: Arc<DeserializeGuard<AgentDeployment>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let failures = {
        let mut failures = ctx.failures.lock().expect("failures lock");
        let n = failures
            .entry(ObjectRef::from_obj(object.as_ref()))
            .or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = BACKOFF_FIRST
        .saturating_mul(1 << failures.min(10).saturating_sub(1))
        .min(BACKOFF_CAP);
    warn!(
        namespace = object.meta().namespace.as_deref().unwrap_or_default(),
        name = object.meta().name.as_deref().unwrap_or_default(),
        failures,
        retry_in_ms = delay.as_millis() as u64,
        "reconcile failed: {error}"
    );
    Action::requeue(delay)
}

/// Every log line of a reconcile names its resource and generation. (The
/// span is attached to the future, not entered: a guard held across an
/// await would tag other reconciles' lines on the same thread.)
async fn reconcile_resource(
    agd: &AgentDeployment,
    ctx: &Context,
) -> Result<(Action, &'static str), Error> {
    let span = tracing::info_span!(
        "reconcile",
        namespace = %agd.namespace().unwrap_or_default(),
        name = %agd.name_any(),
        generation = agd.metadata.generation
    );
    reconcile_steps(agd, ctx).instrument(span).await
}

async fn reconcile_steps(
    agd: &AgentDeployment,
    ctx: &Context,
) -> Result<(Action, &'static str), Error> {
    let namespace = agd.namespace().unwrap_or_default();
    if agd.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children through their owner references.
        return Ok((Action::await_change(), "unchanged"));
    }

    // validate
    let mut valid = match baton_api::validate(agd) {
        Ok(valid) => valid,
        Err(errors) => {
            let violations: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
            let problem = Problem::InvalidSpec(violations);
            let observed = observe(agd, None, ctx, Some(problem));
            write_status(agd, &observed, ctx).await?;
            return Ok((Action::await_change(), "invalid"));
        }
    };
    if valid.resource.spec.sidecar.image.is_none()
        && let Some(image) = &ctx.default_sidecar_image
    {
        valid.sidecar_image = image.clone();
    }

    // A ServiceAccount of the user's choosing must be one marked for
    // agents: the operator creates pods under it.
    if let Some(refusal) = check_service_account(&valid, &namespace, &ctx.client).await? {
        let observed = observe(agd, None, ctx, Some(Problem::InvalidSpec(vec![refusal])));
        write_status(agd, &observed, ctx).await?;
        // A ServiceAccount's annotation triggers no reconcile: look again.
        return Ok((Action::requeue(SERVICE_ACCOUNT_RECHECK), "invalid"));
    }

    // gather
    let credentials = managed_credentials(&valid, &namespace, &ctx.caches);
    let missing_secrets = check_external_secrets(&valid, &namespace, &ctx.client).await?;

    // rollout: the pods, what the draining sidecars say, the next step
    let token = Some(credentials.admin_token.as_str());
    let rollout = read_rollout(agd, &valid, ctx, token).await;
    // A scale-down hands the drained pods' leases back before the
    // StatefulSet loses them.
    for name in &rollout.plan.release {
        if let Some(pod) = rollout.pods.iter().find(|p| &p.pod.name == name) {
            rollout_io::hand_over(&ctx.sidecars, pod, token).await;
        }
    }

    // build
    let mut state = baton_resources::build(&valid, &credentials, &ctx.platform);
    for sts in &mut state.stateful_sets {
        if sts.metadata.name.as_deref() == Some(valid.names.replicas().as_str())
            && let Some(spec) = sts.spec.as_mut()
        {
            spec.replicas = Some(rollout.plan.statefulset_replicas);
        }
    }
    let desired = state.into_objects();
    let desired_keys: BTreeSet<ChildKey> = desired.iter().map(ChildKey::of).collect();

    // apply
    let mut created = Vec::new();
    let mut updated = Vec::new();
    for object in desired {
        let key = ChildKey::of(&object);
        let live = ctx.caches.meta(key.kind, &namespace, &key.name);
        let (object, hash) = children::with_applied_hash(object);
        if !children::needs_apply(
            live.as_ref(),
            &hash,
            &ctx.verified.lock().expect("verified lock"),
        ) {
            continue;
        }
        ctx.write("apply")?;
        match apply::apply(&ctx.client, &namespace, &object).await {
            Ok(applied) => {
                ctx.verified.lock().expect("verified lock").record(&applied);
                if live.is_none() {
                    created.push(key)
                } else {
                    updated.push(key)
                }
            }
            Err(source) => {
                let error = Error::Apply { child: key, source };
                report_problem(agd, Some(&valid), ctx, "ApplyFailed", &error).await;
                return Err(error);
            }
        }
    }
    let owner_uid = agd.uid().unwrap_or_default();
    let live_children = ctx.caches.children_of(&namespace, &owner_uid);
    let prune = children::to_prune(
        live_children.iter().map(|(kind, meta)| (*kind, meta)),
        &owner_uid,
        &desired_keys,
    );
    for key in &prune {
        ctx.write("delete")?;
        if let Err(source) = apply::delete(&ctx.client, &namespace, key).await {
            let error = Error::Prune {
                child: key.clone(),
                source,
            };
            report_problem(agd, Some(&valid), ctx, "ApplyFailed", &error).await;
            return Err(error);
        }
    }
    for (reason, keys) in [
        ("Created", &created),
        ("Updated", &updated),
        ("Pruned", &prune),
    ] {
        if !keys.is_empty() {
            let list: Vec<String> = keys.iter().map(ToString::to_string).collect();
            info!(children = %list.join(", "), "{}", reason.to_lowercase());
            publish(
                ctx,
                agd,
                EventType::Normal,
                reason,
                "Reconcile",
                list.join(", "),
            )
            .await;
        }
    }

    let replicas_applied = updated.iter().chain(&created).any(|k| {
        k.kind == baton_resources::ChildKind::StatefulSet && k.name == valid.names.replicas()
    });
    // The plan read the StatefulSet before this apply; a changed one gets
    // a new revision first, and the next reconcile (its watch event) goes on.
    let mut rollout_status = rollout.plan.status.clone();
    let mut stall = rollout.plan.stall.clone();
    if replicas_applied {
        // The plan judged the template before this apply: neither its
        // "complete" nor its "stalled" holds for the new one.
        rollout_status.phase = RolloutPhase::Progressing;
        rollout_status.message = Some("the replica StatefulSet is being updated".into());
        stall = None;
    }
    if !replicas_applied && let Some(step) = run_rollout(agd, ctx, &rollout, token).await? {
        rollout_status.last_step = Some(step);
    }
    announce_rollout(agd, ctx, &rollout_status, stall.as_ref()).await;

    // status
    let problem =
        (!missing_secrets.is_empty()).then_some(Problem::ExternalSecretMissing(missing_secrets));
    let mut observed = observe(agd, Some(&valid), ctx, problem);
    observed.rollout = Some(rollout_status);
    observed.stall = stall;
    observed.current_revision = rollout.plan.current_revision.clone();
    if replicas_applied && let Some(replicas) = observed.replicas.as_mut() {
        // The cache still holds the template before this apply.
        replicas.up_to_date = false;
    }
    let waiting_for_secret = observed.problem.is_some();
    write_status(agd, &observed, ctx).await?;
    let outcome = if created.is_empty() && updated.is_empty() && prune.is_empty() {
        "unchanged"
    } else {
        "applied"
    };
    let action = if waiting_for_secret {
        Action::requeue(WAIT_FOR_SECRET)
    } else {
        Action::requeue(rollout.plan.requeue.unwrap_or(ctx.resync).min(ctx.resync))
    };
    Ok((action, outcome))
}

/// What the rollout step is decided from, and the decision.
struct RolloutRead {
    pods: Vec<rollout_io::LivePod>,
    probes: Vec<(String, DrainProbe)>,
    plan: Plan,
    update_revision: Option<String>,
}

async fn read_rollout(
    agd: &AgentDeployment,
    valid: &ValidAgentDeployment,
    ctx: &Context,
    token: Option<&str>,
) -> RolloutRead {
    let namespace = agd.namespace().unwrap_or_default();
    let sts = ctx.caches.stateful_set(&namespace, &valid.names.replicas());
    let live_replicas = sts
        .as_ref()
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.replicas);
    let update_revision = sts.as_ref().and_then(|s| {
        let status = s.status.as_ref()?;
        // Only a revision of the template the controller has seen.
        (status.observed_generation >= s.metadata.generation)
            .then(|| status.update_revision.clone())
            .flatten()
    });
    let pods = match sts.as_ref().and_then(|s| s.metadata.uid.clone()) {
        Some(uid) => rollout_io::replica_pods(
            &ctx.caches.pods_of(&namespace, &uid),
            &valid.names.replicas(),
            agd.status
                .as_ref()
                .and_then(|s| s.rollout.as_ref())
                .map_or(&[], |r| r.draining.as_slice()),
        ),
        None => Vec::new(),
    };
    let probes = ctx.sidecars.probe_drains(&pods, token).await;
    let layout_mismatch = match update_revision.as_deref() {
        Some(update) => ctx.sidecars.probe_layouts(&pods, update, token).await,
        None => None,
    };
    let replica_pods: Vec<ReplicaPod> = pods.iter().map(|p| p.pod.clone()).collect();
    let spec = &agd.spec.rollout;
    let plan = rollout::plan(&rollout::Inputs {
        desired: agd.spec.replicas,
        live_replicas,
        update_revision: update_revision.as_deref(),
        pods: &replica_pods,
        probes: &probes,
        paused: spec.paused,
        max_unavailable: spec.max_unavailable,
        progress_deadline: valid.progress_deadline,
        drain_timeout: valid.timings.drain_timeout,
        previous: agd.status.as_ref().and_then(|s| s.rollout.as_ref()),
        now: Timestamp::now(),
        layout_mismatch: layout_mismatch.as_ref(),
        migrate_layout: spec.migrate_layout,
    });
    RolloutRead {
        pods,
        probes,
        plan,
        update_revision,
    }
}

/// Carries out the planned drains and replacements; returns the last step
/// in words for `status.rollout.lastStep`.
async fn run_rollout(
    agd: &AgentDeployment,
    ctx: &Context,
    rollout: &RolloutRead,
    token: Option<&str>,
) -> Result<Option<String>, Error> {
    let namespace = agd.namespace().unwrap_or_default();
    let plan = &rollout.plan;
    let update = rollout.update_revision.as_deref().unwrap_or("?");
    let find = |name: &str| rollout.pods.iter().find(|p| p.pod.name == name);
    let mut last_step = None;
    for pod in plan.redrain.iter().filter_map(|n| find(n)) {
        ctx.leading("drain")?;
        rollout_io::drain_again(&ctx.sidecars, pod, token).await;
    }
    if !plan.drain.is_empty() {
        // The status names the pods before their sidecars are asked: an
        // operator that restarts (or a new leader) then knows they drain.
        let api: Api<AgentDeployment> = Api::namespaced(ctx.client.clone(), &namespace);
        ctx.write("status")?;
        api.patch_status(
            &agd.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": { "rollout": plan.status } })),
        )
        .await?;
    }
    for pod in plan.drain.iter().filter_map(|n| find(n)) {
        ctx.leading("drain")?;
        let in_flight = rollout_io::drain_again(&ctx.sidecars, pod, token).await;
        let removed = pod.pod.ordinal >= agd.spec.replicas;
        let why = if removed {
            "scale-down".to_owned()
        } else {
            format!(
                "revision {} -> {update}",
                pod.pod.revision.as_deref().unwrap_or("?")
            )
        };
        let turns = in_flight.map_or("its sidecar did not answer".to_owned(), |n| {
            format!("{n} turn{} in flight", if n == 1 { "" } else { "s" })
        });
        let note = format!("draining {} ({why}): {turns}", pod.pod.name);
        info!(pod = %pod.pod.name, "{note}");
        publish(
            ctx,
            agd,
            EventType::Normal,
            "Draining",
            "Rollout",
            note.clone(),
        )
        .await;
        last_step = Some(note);
    }
    for pod in plan.replace.iter().filter_map(|n| find(n)) {
        let (drained_in_ms, aborted) = match rollout
            .probes
            .iter()
            .find(|(n, _)| n == &pod.pod.name)
            .map(|(_, p)| p)
        {
            Some(DrainProbe::Drained {
                drained_in_ms,
                aborted,
            }) => (*drained_in_ms, *aborted),
            _ => (None, 0),
        };
        let drained_in_ms = drained_in_ms.or_else(|| {
            pod.pod.drain_started_at.map(|t| {
                Timestamp::now()
                    .as_millisecond()
                    .saturating_sub(t.as_millisecond())
                    .max(0) as u64
            })
        });
        let released = rollout_io::hand_over(&ctx.sidecars, pod, token).await;
        let handed_over = aborted + released;
        let drained = format!(
            "{} drained in {} ms, {handed_over} turn{} handed over",
            pod.pod.name,
            drained_in_ms.map_or("?".into(), |ms| ms.to_string()),
            if handed_over == 1 { "" } else { "s" }
        );
        info!(pod = %pod.pod.name, drained_in_ms, handed_over, "drained");
        publish_about(
            ctx,
            agd,
            Some(&pod.pod),
            EventType::Normal,
            "Drained",
            "Rollout",
            drained.clone(),
        )
        .await;
        ctx.write("pod")?;
        rollout_io::delete_pod(&ctx.client, &namespace, &pod.pod).await?;
        let deleted = format!(
            "deleted {}; the StatefulSet brings it back at revision {update}",
            pod.pod.name
        );
        info!(pod = %pod.pod.name, "deleted for the rollout");
        publish_about(
            ctx,
            agd,
            Some(&pod.pod),
            EventType::Normal,
            "Deleted",
            "Rollout",
            deleted,
        )
        .await;
        last_step = Some(format!("replaced {drained}"));
    }
    // A pod the previous step waited for that is ready now.
    let previous = agd.status.as_ref().and_then(|s| s.rollout.as_ref());
    if let Some(previous) = previous
        && previous.step == Some(RolloutStep::WaitingReady)
        && let Some(name) = &previous.pod
        && let Some(pod) = find(name)
        && pod.pod.ready
        && pod.pod.revision.as_deref() == Some(update)
    {
        let after = pod
            .pod
            .created_at
            .map(|c| {
                format!(
                    " {} ms after it was created",
                    Timestamp::now()
                        .as_millisecond()
                        .saturating_sub(c.as_millisecond())
                )
            })
            .unwrap_or_default();
        let note = format!("{name} is ready at revision {update}{after}");
        publish_about(
            ctx,
            agd,
            Some(&pod.pod),
            EventType::Normal,
            "PodReady",
            "Rollout",
            note.clone(),
        )
        .await;
        if last_step.is_none() {
            last_step = Some(note);
        }
    }
    Ok(last_step)
}

/// An event when the rollout's phase changes: complete, paused, stalled.
async fn announce_rollout(
    agd: &AgentDeployment,
    ctx: &Context,
    new: &baton_api::RolloutStatus,
    stall: Option<&rollout::Stall>,
) {
    let previous = agd.status.as_ref().and_then(|s| s.rollout.as_ref());
    if previous.map(|p| p.phase) == Some(new.phase) {
        return;
    }
    let revision = new.revision.as_deref().unwrap_or("?");
    match new.phase {
        RolloutPhase::Complete if previous.is_some() => {
            let note = format!("every replica runs revision {revision}");
            publish(
                ctx,
                agd,
                EventType::Normal,
                "RolloutComplete",
                "Rollout",
                note,
            )
            .await;
        }
        RolloutPhase::Paused => {
            let note = new.message.clone().unwrap_or_default();
            publish(
                ctx,
                agd,
                EventType::Normal,
                "RolloutPaused",
                "Rollout",
                note,
            )
            .await;
        }
        RolloutPhase::Stalled => {
            if let Some(stall) = stall {
                publish(
                    ctx,
                    agd,
                    EventType::Warning,
                    stall.reason,
                    "Rollout",
                    stall.message.clone(),
                )
                .await;
            }
        }
        _ => {}
    }
}

/// Credentials of the managed stores, read back from their Secrets so a
/// running database keeps its password; only missing ones are generated.
fn managed_credentials(
    valid: &ValidAgentDeployment,
    namespace: &str,
    caches: &Caches,
) -> Credentials {
    let data = |name: String| caches.secret(namespace, &name).and_then(|s| s.data.clone());
    let redis = data(valid.names.redis());
    let postgres = data(valid.names.postgres());
    let minio = data(valid.names.minio());
    let admin = data(valid.names.admin_secret());
    Credentials::reuse_or_generate(
        redis.as_ref(),
        postgres.as_ref(),
        minio.as_ref(),
        admin.as_ref(),
    )
}

/// How often an `AgentDeployment` refused for its ServiceAccount looks again.
const SERVICE_ACCOUNT_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// Why `spec.serviceAccountName` may not be used, if it may not: it must
/// exist and carry `baton.dev/agent-service-account: "true"`.
async fn check_service_account(
    valid: &ValidAgentDeployment,
    namespace: &str,
    client: &Client,
) -> Result<Option<String>, Error> {
    let Some(name) = &valid.resource.spec.service_account_name else {
        return Ok(None);
    };
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), namespace);
    let key = baton_api::constants::annotations::AGENT_SERVICE_ACCOUNT;
    Ok(match api.get_opt(name).await? {
        None => Some(format!(
            "spec.serviceAccountName: ServiceAccount {namespace}/{name} does not exist"
        )),
        Some(account)
            if account
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .is_some_and(|v| v == "true") =>
        {
            None
        }
        Some(_) => Some(format!(
            "spec.serviceAccountName: ServiceAccount {namespace}/{name} is not marked for agents; whoever may give pods that account annotates it {key}=true (kubectl annotate serviceaccount -n {namespace} {name} {key}=true)"
        )),
    })
}

/// Every external store Secret that is missing or lacks a key the sidecar
/// reads, as messages naming the Secret and the key.
async fn check_external_secrets(
    valid: &ValidAgentDeployment,
    namespace: &str,
    client: &Client,
) -> Result<Vec<String>, Error> {
    let mut wanted: Vec<(String, Vec<String>, &str)> = Vec::new();
    if let Dependency::External(e) = &valid.redis {
        wanted.push((
            e.secret_ref.name.clone(),
            vec![e.secret_ref.url_key.clone()],
            "redis",
        ));
    }
    if let Dependency::External(e) = &valid.postgres {
        wanted.push((
            e.secret_ref.name.clone(),
            vec![e.secret_ref.url_key.clone()],
            "postgres",
        ));
    }
    if let Dependency::External(e) = &valid.object_store {
        let keys = [
            secret_keys::ENDPOINT,
            secret_keys::ACCESS_KEY_ID,
            secret_keys::SECRET_ACCESS_KEY,
        ];
        wanted.push((
            e.secret_ref.name.clone(),
            keys.map(String::from).into(),
            "objectStore",
        ));
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut problems = Vec::new();
    for (name, keys, dependency) in wanted {
        match api.get_opt(&name).await? {
            None => problems.push(format!(
                "Secret {namespace}/{name} (spec.dependencies.{dependency}.external.secretRef) does not exist"
            )),
            Some(secret) => {
                let data = secret.data.unwrap_or_default();
                let strings = secret.string_data.unwrap_or_default();
                for key in keys {
                    if !data.contains_key(&key) && !strings.contains_key(&key) {
                        problems.push(format!(
                            "Secret {namespace}/{name} (spec.dependencies.{dependency}.external.secretRef) has no key {key:?}"
                        ));
                    }
                }
            }
        }
    }
    Ok(problems)
}

/// What the status is computed from, read from the caches.
fn observe(
    agd: &AgentDeployment,
    valid: Option<&ValidAgentDeployment>,
    ctx: &Context,
    problem: Option<Problem>,
) -> Observed {
    let namespace = agd.namespace().unwrap_or_default();
    let names = baton_api::names::ChildNames::new(agd.name_any());
    let replicas = ctx
        .caches
        .stateful_set(&namespace, &names.replicas())
        .map(|sts| {
            let status = sts.status.clone().unwrap_or_default();
            ReplicaObservation {
                up_to_date: status.observed_generation >= sts.metadata.generation,
                replicas: status.replicas,
                ready_replicas: status.ready_replicas.unwrap_or(0),
                updated_replicas: status.updated_replicas.unwrap_or(0),
                current_revision: status.current_revision,
                update_revision: status.update_revision,
            }
        });
    let mut stores = Vec::new();
    if let Some(valid) = valid {
        let store_ready = |name: &str| {
            ctx.caches
                .stateful_set(&namespace, name)
                .and_then(|s| s.status.as_ref().and_then(|st| st.ready_replicas))
                .unwrap_or(0)
                >= 1
        };
        if matches!(valid.redis, Dependency::Managed(_)) {
            stores.push(StoreObservation {
                name: format!("redis (StatefulSet {})", valid.names.redis()),
                ready: store_ready(&valid.names.redis()),
            });
        }
        if matches!(valid.postgres, Dependency::Managed(_)) {
            stores.push(StoreObservation {
                name: format!("postgres (StatefulSet {})", valid.names.postgres()),
                ready: store_ready(&valid.names.postgres()),
            });
        }
        if matches!(valid.object_store, Dependency::Managed(_)) {
            stores.push(StoreObservation {
                name: format!("object store (StatefulSet {})", valid.names.minio()),
                ready: store_ready(&valid.names.minio()),
            });
            let bucket_made = ctx
                .caches
                .job(&namespace, &valid.names.bucket_job())
                .and_then(|j| j.status.as_ref().and_then(|s| s.succeeded))
                .unwrap_or(0)
                >= 1;
            stores.push(StoreObservation {
                name: format!("bucket (Job {})", valid.names.bucket_job()),
                ready: bucket_made,
            });
        }
    }
    let selector = valid.map(|v| {
        selector_labels(v, App::Agent)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    });
    Observed {
        generation: agd.metadata.generation,
        desired_replicas: agd.spec.replicas,
        selector,
        problem,
        replicas,
        stores,
        ..Observed::default()
    }
}

/// Writes the status computed from `observed` if it differs from the
/// current one, and an event when a problem appears or changes.
async fn write_status(
    agd: &AgentDeployment,
    observed: &Observed,
    ctx: &Context,
) -> Result<(), Error> {
    let previous = agd.status.as_ref();
    let new = status::compute(observed, previous, &now());
    announce_problem(agd, previous, observed, ctx).await;
    if previous == Some(&new) {
        return Ok(());
    }
    let api: Api<AgentDeployment> =
        Api::namespaced(ctx.client.clone(), &agd.namespace().unwrap_or_default());
    ctx.write("status")?;
    api.patch_status(
        &agd.name_any(),
        &PatchParams::default(),
        &Patch::Merge(status::patch(previous, &new)),
    )
    .await?;
    Ok(())
}

/// A Warning event for a problem that was not already reported in the
/// status (the same problem on every resync would be noise).
async fn announce_problem(
    agd: &AgentDeployment,
    previous: Option<&AgentDeploymentStatus>,
    observed: &Observed,
    ctx: &Context,
) {
    let Some(problem) = &observed.problem else {
        return;
    };
    let degraded = status::find(previous, condition_types::DEGRADED);
    let already = degraded.is_some_and(|c| {
        c.status == "True" && c.reason == problem.reason() && c.message == problem.message()
    });
    if !already {
        publish(
            ctx,
            agd,
            EventType::Warning,
            problem.reason(),
            "Validate",
            problem.message(),
        )
        .await;
    }
}

/// A failure that stops the reconcile: a Warning event and, best effort, a
/// Degraded status naming it.
async fn report_problem(
    agd: &AgentDeployment,
    valid: Option<&ValidAgentDeployment>,
    ctx: &Context,
    reason: &str,
    error: &Error,
) {
    let problem = match error {
        Error::WatchNotReady(_) => Problem::WatchNotReady(error.to_string()),
        _ => Problem::ApplyFailed(error.to_string()),
    };
    let observed = observe(agd, valid, ctx, Some(problem));
    publish(
        ctx,
        agd,
        EventType::Warning,
        reason,
        "Reconcile",
        error.to_string(),
    )
    .await;
    // Best effort: the reconcile error is what drives the retry.
    let previous = agd.status.as_ref();
    let new = status::compute(&observed, previous, &now());
    if previous != Some(&new) && ctx.write("status").is_ok() {
        let api: Api<AgentDeployment> =
            Api::namespaced(ctx.client.clone(), &agd.namespace().unwrap_or_default());
        let _ = api
            .patch_status(
                &agd.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status::patch(previous, &new)),
            )
            .await;
    }
}

async fn publish(
    ctx: &Context,
    agd: &AgentDeployment,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    publish_about(ctx, agd, None, type_, reason, action, note).await
}

/// An event on the resource, naming `pod` as the related object: the
/// recorder folds repeats of one reason about the same objects into a
/// series that keeps the first note, so each pod's step needs its own.
async fn publish_about(
    ctx: &Context,
    agd: &AgentDeployment,
    pod: Option<&ReplicaPod>,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let secondary = pod.map(|p| k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(p.name.clone()),
        namespace: agd.namespace(),
        uid: Some(p.uid.clone()),
        ..Default::default()
    });
    let event = Event {
        type_,
        reason: reason.to_owned(),
        // Events cap notes at 1 kB.
        note: Some(note.chars().take(1000).collect()),
        action: action.to_owned(),
        secondary,
    };
    if ctx.write("event").is_err() {
        return;
    }
    if let Err(error) = ctx.recorder.publish(&event, &agd.object_ref(&())).await {
        warn!("could not publish event {reason}: {error}");
    }
}

/// An object the API server holds but that does not read as an
/// `AgentDeployment` (written under a CRD version without validation, say):
/// say so in its status and go on with the others.
async fn report_malformed(
    invalid: &InvalidObject,
    ctx: &Context,
) -> Result<(Action, &'static str), Error> {
    let meta = &invalid.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    warn!(%namespace, %name, "malformed AgentDeployment: {}", invalid.error);
    let resource = ApiResource::erase::<AgentDeployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let Some(current) = api.get_opt(&name).await? else {
        return Ok((Action::await_change(), "invalid"));
    };
    let previous: Option<AgentDeploymentStatus> = current
        .data
        .get("status")
        .and_then(|s| serde_json::from_value::<PreviousConditions>(s.clone()).ok())
        .map(|p| AgentDeploymentStatus {
            conditions: p.conditions,
            ..AgentDeploymentStatus::default()
        });
    let problem = Problem::MalformedObject(invalid.error.clone());
    let observed = Observed {
        generation: meta.generation,
        problem: Some(problem.clone()),
        ..Observed::default()
    };
    let new = status::compute(&observed, previous.as_ref(), &now());
    let unchanged = previous
        .as_ref()
        .is_some_and(|p| p.conditions == new.conditions);
    if !unchanged {
        let reference = current.object_ref(&resource);
        let event = Event {
            type_: EventType::Warning,
            reason: problem.reason().to_owned(),
            note: Some(problem.message().chars().take(1000).collect()),
            action: "Validate".to_owned(),
            secondary: None,
        };
        ctx.write("event")?;
        if let Err(error) = ctx.recorder.publish(&event, &reference).await {
            warn!("could not publish event: {error}");
        }
        ctx.write("status")?;
        let patch = serde_json::json!({ "status": { "observedGeneration": meta.generation, "conditions": new.conditions } });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    Ok((Action::await_change(), "invalid"))
}

/// The part of a malformed object's status we can still read.
#[derive(serde::Deserialize)]
struct PreviousConditions {
    #[serde(default)]
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}
