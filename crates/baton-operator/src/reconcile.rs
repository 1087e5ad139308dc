//! One reconcile of one `AgentDeployment`: observe → decide → execute.
//! [`crate::observe`] reads everything the reconcile depends on into one
//! value, [`crate::decide`] turns it into every action without I/O (using
//! the pure builders of `baton-resources`, [`crate::children`],
//! [`crate::rollout`] and [`crate::status`]), and the executor here performs
//! them: the only place that writes to the API server or calls a sidecar.

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_api::names::ChildNames;
use baton_api::{AgentDeployment, AgentDeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::error_boundary::{DeserializeGuard, InvalidObject};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{Instrument as _, info, warn};

use crate::apply;
pub use crate::context::{Context, Error};
use crate::decide::{self, Decision, Note, Outcome, Requeue, RolloutActions};
use crate::metrics::ResultLabel;
use crate::observe::{self, Observation, Stage};
use crate::rollout;
use crate::rollout_io;
use crate::status::{self, Observed, Problem};

/// How long a reconcile waits for the watch caches to be filled.
const CACHE_WAIT: Duration = Duration::from_secs(10);
/// Backoff after a failed reconcile: doubles from the first to the cap.
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(120);

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
            let observed = Observed {
                generation: agd.metadata.generation,
                desired_replicas: agd.spec.replicas,
                problem: Some(Problem::WatchNotReady(error.to_string())),
                replicas: observe::replica_observation(
                    &ctx.caches,
                    &agd.namespace().unwrap_or_default(),
                    &ChildNames::new(agd.name_any()),
                ),
                ..Observed::default()
            };
            report_problem(agd, &observed, &ctx, "WatchNotReady", &error).await;
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
        Ok((_, outcome)) => ResultLabel {
            result: outcome.label(),
            error: "",
        },
        Err(error) => ResultLabel {
            result: "error",
            error: error.kind(),
        },
    };
    ctx.metrics.reconciles.get_or_create(&label).inc();
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
) -> Result<(Action, Outcome), Error> {
    let span = tracing::info_span!(
        "reconcile",
        namespace = %agd.namespace().unwrap_or_default(),
        name = %agd.name_any(),
        generation = agd.metadata.generation
    );
    reconcile_steps(agd, ctx).instrument(span).await
}

async fn reconcile_steps(agd: &AgentDeployment, ctx: &Context) -> Result<(Action, Outcome), Error> {
    let observation = observe::observe(agd, ctx).await?;
    let decision = {
        let verified = ctx.verified.lock().expect("verified lock");
        decide::decide(&observation, &ctx.settings, &verified)
    };
    execute(agd, &observation, decision, ctx).await
}

/// Performs a decision, in the order [`decide`] documents.
async fn execute(
    agd: &AgentDeployment,
    observation: &Observation,
    decision: Decision,
    ctx: &Context,
) -> Result<(Action, Outcome), Error> {
    let namespace = agd.namespace().unwrap_or_default();
    let token = match &observation.stage {
        Stage::Valid(world) => Some(world.credentials.admin_token.clone()),
        _ => None,
    };
    let token = token.as_deref();
    for pod in &decision.hand_over {
        rollout_io::hand_over(&ctx.sidecars, pod, token).await;
    }
    let failed = |error: Error| {
        let mut status = decision.status.clone().unwrap_or_default();
        status.problem = Some(Problem::ApplyFailed(error.to_string()));
        (status, error)
    };
    for apply in &decision.apply {
        ctx.write("apply")?;
        match apply::apply(&ctx.client, &namespace, &apply.object).await {
            Ok(applied) => ctx.verified.lock().expect("verified lock").record(&applied),
            Err(source) => {
                let (status, error) = failed(Error::Apply {
                    child: apply.key.clone(),
                    source,
                });
                report_problem(agd, &status, ctx, "ApplyFailed", &error).await;
                return Err(error);
            }
        }
    }
    for key in &decision.prune {
        ctx.write("delete")?;
        if let Err(source) = apply::delete(&ctx.client, &namespace, key).await {
            let (status, error) = failed(Error::Prune {
                child: key.clone(),
                source,
            });
            report_problem(agd, &status, ctx, "ApplyFailed", &error).await;
            return Err(error);
        }
    }
    for note in decision.children_events() {
        info!(children = %note.note, "{}", note.reason.to_lowercase());
        publish(ctx, agd, &note).await;
    }
    let last_step = match &decision.rollout {
        Some(rollout) => run_rollout(agd, ctx, rollout, token).await?,
        None => None,
    };
    for note in &decision.events {
        publish(ctx, agd, note).await;
    }
    if let Some(mut status) = decision.status {
        if let (Some(step), Some(rollout)) = (last_step, status.rollout.as_mut()) {
            rollout.last_step = Some(step);
        }
        write_status(agd, &status, ctx).await?;
    }
    let action = match decision.requeue {
        Requeue::AwaitChange => Action::await_change(),
        Requeue::After(delay) => Action::requeue(delay),
    };
    Ok((action, decision.outcome))
}

/// Carries out a rollout step; returns the last step in words for
/// `status.rollout.lastStep`.
async fn run_rollout(
    agd: &AgentDeployment,
    ctx: &Context,
    rollout: &RolloutActions,
    token: Option<&str>,
) -> Result<Option<String>, Error> {
    let namespace = agd.namespace().unwrap_or_default();
    let mut last_step = None;
    for pod in &rollout.redrain {
        ctx.leading("drain")?;
        rollout_io::drain_again(&ctx.sidecars, pod, token).await;
    }
    if let Some(status) = &rollout.mark_draining {
        // The status names the pods before their sidecars are asked: an
        // operator that restarts (or a new leader) then knows they drain.
        let api: Api<AgentDeployment> = Api::namespaced(ctx.client.clone(), &namespace);
        ctx.write("status")?;
        api.patch_status(
            &agd.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": { "rollout": status } })),
        )
        .await?;
    }
    for drain in &rollout.drain {
        ctx.leading("drain")?;
        let in_flight = rollout_io::drain_again(&ctx.sidecars, &drain.pod, token).await;
        let note = decide::draining_note(drain, in_flight);
        info!(pod = %drain.pod.pod.name, "{note}");
        publish(ctx, agd, &Note::normal("Draining", "Rollout", note.clone())).await;
        last_step = Some(note);
    }
    for replace in &rollout.replace {
        let pod = &replace.pod.pod;
        let released = rollout_io::hand_over(&ctx.sidecars, &replace.pod, token).await;
        let drained = decide::drained_note(replace, released);
        info!(pod = %pod.name, drained_in_ms = replace.drained_in_ms, "{drained}");
        let note = Note::normal("Drained", "Rollout", drained.clone()).about(pod);
        publish(ctx, agd, &note).await;
        ctx.write("pod")?;
        rollout_io::delete_pod(&ctx.client, &namespace, pod).await?;
        info!(pod = %pod.name, "deleted for the rollout");
        let note = Note::normal("Deleted", "Rollout", decide::deleted_note(replace)).about(pod);
        publish(ctx, agd, &note).await;
        last_step = Some(decide::replaced_note(&drained));
    }
    if let Some((pod, note)) = &rollout.ready {
        publish(
            ctx,
            agd,
            &Note::normal("PodReady", "Rollout", note.clone()).about(pod),
        )
        .await;
        if last_step.is_none() {
            last_step = Some(note.clone());
        }
    }
    Ok(last_step)
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
    if let Some(note) = decide::problem_event(previous, observed.problem.as_ref()) {
        publish(ctx, agd, &note).await;
    }
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

/// A failure that stops the reconcile: a Warning event and, best effort, a
/// Degraded status naming it (`observed` carries the problem).
async fn report_problem(
    agd: &AgentDeployment,
    observed: &Observed,
    ctx: &Context,
    reason: &str,
    error: &Error,
) {
    publish(
        ctx,
        agd,
        &Note::warning(reason, "Reconcile", error.to_string()),
    )
    .await;
    // Best effort: the reconcile error is what drives the retry.
    let previous = agd.status.as_ref();
    let new = status::compute(observed, previous, &now());
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

/// An event on the resource, naming the note's pod as the related object:
/// the recorder folds repeats of one reason about the same objects into a
/// series that keeps the first note, so each pod's step needs its own.
async fn publish(ctx: &Context, agd: &AgentDeployment, note: &Note) {
    let secondary = note
        .pod
        .as_ref()
        .map(|p| k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(p.name.clone()),
            namespace: agd.namespace(),
            uid: Some(p.uid.clone()),
            ..Default::default()
        });
    let event = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.clone(),
        // Events cap notes at 1 kB.
        note: Some(note.note.chars().take(1000).collect()),
        action: note.action.to_owned(),
        secondary,
    };
    if ctx.write("event").is_err() {
        return;
    }
    if let Err(error) = ctx.recorder.publish(&event, &agd.object_ref(&())).await {
        warn!("could not publish event {}: {error}", note.reason);
    }
}

/// An object the API server holds but that does not read as an
/// `AgentDeployment` (written under a CRD version without validation, say):
/// say so in its status and go on with the others.
async fn report_malformed(
    invalid: &InvalidObject,
    ctx: &Context,
) -> Result<(Action, Outcome), Error> {
    let meta = &invalid.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    warn!(%namespace, %name, "malformed AgentDeployment: {}", invalid.error);
    let resource = ApiResource::erase::<AgentDeployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let Some(current) = api.get_opt(&name).await? else {
        return Ok((Action::await_change(), Outcome::Invalid));
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
    Ok((Action::await_change(), Outcome::Invalid))
}

/// The part of a malformed object's status we can still read.
#[derive(serde::Deserialize)]
struct PreviousConditions {
    #[serde(default)]
    conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}
