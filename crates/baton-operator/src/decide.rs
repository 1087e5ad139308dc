//! The middle of a reconcile: from an [`Observation`] to every action, as a
//! pure function. Nothing here awaits or reads a clock; [`decide`] is what
//! the table tests below run, in milliseconds, for the cases the
//! integration tests cover on a real control plane and for those they
//! cannot reach.
//!
//! The executor ([`crate::reconcile`]) performs the actions in this order:
//! hand over the leases of the pods a scale-down removes, apply, prune, the
//! rollout step (drain again, mark draining in the status, drain, replace),
//! the events, the status. Two things are known only once an action ran
//! (how many turns a drained sidecar still had, how many it handed over):
//! their wording is here ([`draining_note`], [`replaced_note`]) and the
//! executor fills in the numbers.

use std::collections::BTreeSet;
use std::time::Duration;

use baton_api::{AgentDeploymentStatus, RolloutPhase, RolloutStatus, RolloutStep, condition_types};
use baton_resources::{ChildKind, ChildObject, Platform};
use k8s_openapi::jiff::Timestamp;

use crate::children::{self, ChildKey, Verified};
use crate::observation::{self, ExternalSecret, Observation, Stage, World};
use crate::rollout::{self, DrainProbe, ReplicaPod, Stall};
use crate::rollout_io::LivePod;
use crate::status::{self, Observed, Problem};

/// How soon a resource waiting for an external Secret is checked again.
pub const WAIT_FOR_SECRET: Duration = Duration::from_secs(3);
/// How often an `AgentDeployment` refused for its ServiceAccount looks
/// again (a ServiceAccount's annotation triggers no reconcile).
pub const SERVICE_ACCOUNT_RECHECK: Duration = Duration::from_secs(30);

/// The operator's settings a decision depends on.
#[derive(Clone, Debug)]
pub struct Settings {
    /// What the operator adds to every deployment's objects.
    pub platform: Platform,
    /// How often an unchanged, healthy resource is checked again.
    pub resync: Duration,
}

/// Everything one reconcile does.
#[derive(Clone, Debug)]
pub struct Decision {
    /// Pods a scale-down removes whose leases go back before the
    /// StatefulSet loses them.
    pub hand_over: Vec<LivePod>,
    /// Children to apply, in apply order.
    pub apply: Vec<Apply>,
    /// Children to delete, in reverse apply order.
    pub prune: Vec<ChildKey>,
    /// The rollout's step, unless this reconcile changes the replica
    /// StatefulSet (its new revision comes first).
    pub rollout: Option<RolloutActions>,
    /// Events after the rollout's own: a phase change of the rollout.
    pub events: Vec<Note>,
    /// What the status is computed from (the executor adds the rollout's
    /// last step once it ran).
    pub status: Option<Observed>,
    pub requeue: Requeue,
    pub outcome: Outcome,
}

/// One child to apply.
#[derive(Clone, Debug)]
pub struct Apply {
    pub key: ChildKey,
    /// As built, with its applied-hash annotation.
    pub object: ChildObject,
    /// It does not exist yet (the event says Created, not Updated).
    pub create: bool,
}

/// A rollout step.
#[derive(Clone, Debug, Default)]
pub struct RolloutActions {
    /// Draining pods whose sidecar is not draining: ask again.
    pub redrain: Vec<LivePod>,
    /// The rollout status that lists the pods about to drain, written
    /// before any of them is asked (a new leader then knows they drain).
    pub mark_draining: Option<RolloutStatus>,
    pub drain: Vec<Drain>,
    pub replace: Vec<Replace>,
    /// A pod the previous step waited for that is ready now.
    pub ready: Option<(ReplicaPod, String)>,
}

/// A pod to drain, and why (for the event).
#[derive(Clone, Debug)]
pub struct Drain {
    pub pod: LivePod,
    pub why: String,
}

/// A drained pod to hand over and delete.
#[derive(Clone, Debug)]
pub struct Replace {
    pub pod: LivePod,
    pub drained_in_ms: Option<u64>,
    /// Turns its drain aborted at the timeout (their sessions moved on).
    pub aborted: u64,
    /// The revision the StatefulSet brings it back at.
    pub update_revision: String,
}

/// An event on the `AgentDeployment`, optionally about one of its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub action: &'static str,
    pub note: String,
    pub pod: Option<ReplicaPod>,
}

impl Note {
    pub fn normal(reason: &str, action: &'static str, note: String) -> Self {
        Self {
            warning: false,
            reason: reason.to_owned(),
            action,
            note,
            pod: None,
        }
    }

    pub fn warning(reason: &str, action: &'static str, note: String) -> Self {
        Self {
            warning: true,
            ..Self::normal(reason, action, note)
        }
    }

    pub fn about(self, pod: &ReplicaPod) -> Self {
        Self {
            pod: Some(pod.clone()),
            ..self
        }
    }
}

/// When the controller looks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeue {
    /// Only when something it watches changes.
    AwaitChange,
    After(Duration),
}

/// The `result` label of the reconcile metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Unchanged,
    Applied,
    Invalid,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::Applied => "applied",
            Self::Invalid => "invalid",
        }
    }
}

impl Decision {
    fn only_status(status: Observed, requeue: Requeue, outcome: Outcome) -> Self {
        Self {
            hand_over: Vec::new(),
            apply: Vec::new(),
            prune: Vec::new(),
            rollout: None,
            events: Vec::new(),
            status: Some(status),
            requeue,
            outcome,
        }
    }

    /// The events for the applied and pruned children.
    pub fn children_events(&self) -> Vec<Note> {
        let keys = |create: bool| -> Vec<String> {
            self.apply
                .iter()
                .filter(|a| a.create == create)
                .map(|a| a.key.to_string())
                .collect()
        };
        let pruned: Vec<String> = self.prune.iter().map(ToString::to_string).collect();
        [
            ("Created", keys(true)),
            ("Updated", keys(false)),
            ("Pruned", pruned),
        ]
        .into_iter()
        .filter(|(_, list)| !list.is_empty())
        .map(|(reason, list)| Note::normal(reason, "Reconcile", list.join(", ")))
        .collect()
    }
}

/// Every action of one reconcile, from what was observed.
pub fn decide(observation: &Observation, settings: &Settings, verified: &Verified) -> Decision {
    let agd = &observation.agd;
    let status = |problem: Option<Problem>| Observed {
        generation: agd.metadata.generation,
        desired_replicas: agd.spec.replicas,
        problem,
        replicas: observation.replicas.clone(),
        ..Observed::default()
    };
    match &observation.stage {
        Stage::Deleting => Decision {
            status: None,
            ..Decision::only_status(status(None), Requeue::AwaitChange, Outcome::Unchanged)
        },
        Stage::Invalid(violations) => Decision::only_status(
            status(Some(Problem::InvalidSpec(violations.clone()))),
            Requeue::AwaitChange,
            Outcome::Invalid,
        ),
        Stage::AccountRefused(refusal) => Decision::only_status(
            status(Some(Problem::InvalidSpec(vec![refusal.clone()]))),
            Requeue::After(SERVICE_ACCOUNT_RECHECK),
            Outcome::Invalid,
        ),
        Stage::Valid(world) => decide_valid(observation, world, settings, verified),
    }
}

fn decide_valid(
    observation: &Observation,
    world: &World,
    settings: &Settings,
    verified: &Verified,
) -> Decision {
    let agd = &observation.agd;
    let valid = &world.valid;
    let spec = &agd.spec.rollout;
    let replica_pods: Vec<ReplicaPod> = world.pods.iter().map(|p| p.pod.clone()).collect();
    let previous_rollout = agd.status.as_ref().and_then(|s| s.rollout.as_ref());
    let plan = rollout::plan(&rollout::Inputs {
        desired: agd.spec.replicas,
        live_replicas: world.live_replicas,
        update_revision: world.update_revision.as_deref(),
        pods: &replica_pods,
        probes: &world.probes,
        paused: spec.paused,
        max_unavailable: spec.max_unavailable,
        progress_deadline: valid.progress_deadline,
        drain_timeout: valid.timings.drain_timeout,
        previous: previous_rollout,
        now: observation.now,
        layout_mismatch: world.layout_mismatch.as_ref(),
        migrate_layout: spec.migrate_layout,
    });
    let find = |name: &String| world.pods.iter().find(|p| &p.pod.name == name).cloned();

    // The children as built, the replica count as the rollout says.
    let mut state = world.desired.clone();
    for sts in &mut state.stateful_sets {
        if sts.metadata.name.as_deref() == Some(valid.names.replicas().as_str())
            && let Some(spec) = sts.spec.as_mut()
        {
            spec.replicas = Some(plan.statefulset_replicas);
        }
    }
    let desired = state.into_objects();
    let desired_keys: BTreeSet<ChildKey> = desired.iter().map(ChildKey::of).collect();
    let apply: Vec<Apply> = desired
        .into_iter()
        .filter_map(|object| {
            let key = ChildKey::of(&object);
            let live = world.live.get(&key);
            let (object, hash) = children::with_applied_hash(object);
            children::needs_apply(live, &hash, verified).then(|| Apply {
                create: live.is_none(),
                key,
                object,
            })
        })
        .collect();
    let owner_uid = agd.metadata.uid.clone().unwrap_or_default();
    let prune = children::to_prune(
        world.owned.iter().map(|(kind, meta)| (*kind, meta)),
        &owner_uid,
        &desired_keys,
    );

    // The plan judged the template before this apply: a changed replica
    // StatefulSet gets its new revision first, and the next reconcile (its
    // watch event) goes on; neither "complete" nor "stalled" holds for it.
    let replicas_applied = apply
        .iter()
        .any(|a| a.key.kind == ChildKind::StatefulSet && a.key.name == valid.names.replicas());
    let mut rollout_status = plan.status.clone();
    let mut stall = plan.stall.clone();
    let rollout = if replicas_applied {
        rollout_status.phase = RolloutPhase::Progressing;
        rollout_status.message = Some("the replica StatefulSet is being updated".into());
        stall = None;
        None
    } else {
        let update = world.update_revision.clone().unwrap_or_else(|| "?".into());
        Some(RolloutActions {
            redrain: plan.redrain.iter().filter_map(find).collect(),
            mark_draining: (!plan.drain.is_empty()).then(|| plan.status.clone()),
            drain: plan
                .drain
                .iter()
                .filter_map(find)
                .map(|pod| Drain {
                    why: drain_reason(&pod.pod, agd.spec.replicas, &update),
                    pod,
                })
                .collect(),
            replace: plan
                .replace
                .iter()
                .filter_map(find)
                .map(|pod| replace(pod, &world.probes, observation.now, &update))
                .collect(),
            ready: now_ready(previous_rollout, &world.pods, &update, observation.now),
        })
    };
    let hand_over = plan.release.iter().filter_map(find).collect();
    let events = rollout_phase_event(previous_rollout, &rollout_status, stall.as_ref())
        .into_iter()
        .collect();

    let missing = missing_secrets(
        &world.external_secrets,
        agd.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let waiting_for_secret = !missing.is_empty();
    let mut replicas = observation.replicas.clone();
    if replicas_applied && let Some(replicas) = replicas.as_mut() {
        // The cache still holds the template before this apply.
        replicas.up_to_date = false;
    }
    let status = Observed {
        generation: agd.metadata.generation,
        desired_replicas: agd.spec.replicas,
        selector: Some(observation::selector(valid)),
        problem: waiting_for_secret.then_some(Problem::ExternalSecretMissing(missing)),
        replicas,
        stores: world.stores.clone(),
        rollout: Some(rollout_status),
        stall,
        current_revision: plan.current_revision.clone(),
    };
    let requeue = if waiting_for_secret {
        WAIT_FOR_SECRET
    } else {
        plan.requeue.unwrap_or(settings.resync).min(settings.resync)
    };
    let outcome = if apply.is_empty() && prune.is_empty() {
        Outcome::Unchanged
    } else {
        Outcome::Applied
    };
    Decision {
        hand_over,
        apply,
        prune,
        rollout,
        events,
        status: Some(status),
        requeue: Requeue::After(requeue),
        outcome,
    }
}

/// Why a pod drains: it is above the desired count, or at an old revision.
fn drain_reason(pod: &ReplicaPod, desired: i32, update: &str) -> String {
    if pod.ordinal >= desired {
        "scale-down".to_owned()
    } else {
        format!(
            "revision {} -> {update}",
            pod.revision.as_deref().unwrap_or("?")
        )
    }
}

fn replace(pod: LivePod, probes: &[(String, DrainProbe)], now: Timestamp, update: &str) -> Replace {
    let (drained_in_ms, aborted) = match probes.iter().find(|(n, _)| n == &pod.pod.name) {
        Some((
            _,
            DrainProbe::Drained {
                drained_in_ms,
                aborted,
            },
        )) => (*drained_in_ms, *aborted),
        _ => (None, 0),
    };
    // A sidecar that did not say: the time since the drain began.
    let drained_in_ms = drained_in_ms.or_else(|| {
        pod.pod.drain_started_at.map(|t| {
            now.as_millisecond()
                .saturating_sub(t.as_millisecond())
                .max(0) as u64
        })
    });
    Replace {
        pod,
        drained_in_ms,
        aborted,
        update_revision: update.to_owned(),
    }
}

/// The pod the previous step waited for, when it is ready at the update
/// revision now, and the note saying so.
fn now_ready(
    previous: Option<&RolloutStatus>,
    pods: &[LivePod],
    update: &str,
    now: Timestamp,
) -> Option<(ReplicaPod, String)> {
    let previous = previous?;
    if previous.step != Some(RolloutStep::WaitingReady) {
        return None;
    }
    let name = previous.pod.as_ref()?;
    let pod = &pods.iter().find(|p| &p.pod.name == name)?.pod;
    if !pod.ready || pod.revision.as_deref() != Some(update) {
        return None;
    }
    let after = pod
        .created_at
        .map(|c| {
            format!(
                " {} ms after it was created",
                now.as_millisecond().saturating_sub(c.as_millisecond())
            )
        })
        .unwrap_or_default();
    Some((
        pod.clone(),
        format!("{name} is ready at revision {update}{after}"),
    ))
}

/// An event when the rollout's phase changes: complete, paused, stalled.
fn rollout_phase_event(
    previous: Option<&RolloutStatus>,
    new: &RolloutStatus,
    stall: Option<&Stall>,
) -> Option<Note> {
    if previous.map(|p| p.phase) == Some(new.phase) {
        return None;
    }
    let revision = new.revision.as_deref().unwrap_or("?");
    match new.phase {
        RolloutPhase::Complete if previous.is_some() => Some(Note::normal(
            "RolloutComplete",
            "Rollout",
            format!("every replica runs revision {revision}"),
        )),
        RolloutPhase::Paused => Some(Note::normal(
            "RolloutPaused",
            "Rollout",
            new.message.clone().unwrap_or_default(),
        )),
        RolloutPhase::Stalled => {
            stall.map(|stall| Note::warning(stall.reason, "Rollout", stall.message.clone()))
        }
        _ => None,
    }
}

/// A Warning event for a problem that the status does not already report
/// (the same problem on every resync would be noise).
pub fn problem_event(
    previous: Option<&AgentDeploymentStatus>,
    problem: Option<&Problem>,
) -> Option<Note> {
    let problem = problem?;
    let degraded = status::find(previous, condition_types::DEGRADED);
    let already = degraded.is_some_and(|c| {
        c.status == "True" && c.reason == problem.reason() && c.message == problem.message()
    });
    (!already).then(|| Note::warning(problem.reason(), "Validate", problem.message()))
}

/// Every external store Secret that is missing or lacks a key the sidecar
/// reads, as messages naming the Secret, the spec field and the key.
fn missing_secrets(secrets: &[ExternalSecret], namespace: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for secret in secrets {
        let (name, dependency) = (&secret.name, secret.dependency);
        let Some(present) = &secret.present else {
            problems.push(format!(
                "Secret {namespace}/{name} (spec.dependencies.{dependency}.external.secretRef) does not exist"
            ));
            continue;
        };
        for key in secret.wanted.iter().filter(|k| !present.contains(k)) {
            problems.push(format!(
                "Secret {namespace}/{name} (spec.dependencies.{dependency}.external.secretRef) has no key {key:?}"
            ));
        }
    }
    problems
}

/// The Draining event's note, once the sidecar said how many turns run
/// (`None`: it did not answer).
pub fn draining_note(drain: &Drain, in_flight: Option<u64>) -> String {
    let turns = in_flight.map_or("its sidecar did not answer".to_owned(), |n| {
        format!("{n} turn{} in flight", if n == 1 { "" } else { "s" })
    });
    format!("draining {} ({}): {turns}", drain.pod.pod.name, drain.why)
}

/// The Drained event's note, once the handover said how many leases it
/// released.
pub fn drained_note(replace: &Replace, released: u64) -> String {
    let handed_over = replace.aborted + released;
    format!(
        "{} drained in {} ms, {handed_over} turn{} handed over",
        replace.pod.pod.name,
        replace
            .drained_in_ms
            .map_or("?".into(), |ms| ms.to_string()),
        if handed_over == 1 { "" } else { "s" }
    )
}

/// The Deleted event's note.
pub fn deleted_note(replace: &Replace) -> String {
    format!(
        "deleted {}; the StatefulSet brings it back at revision {}",
        replace.pod.pod.name, replace.update_revision
    )
}

/// `status.rollout.lastStep` after a replacement.
pub fn replaced_note(drained_note: &str) -> String {
    format!("replaced {drained_note}")
}

#[cfg(test)]
mod tests {
    //! One reconcile decided from a hand-made observation per case: the
    //! cases of the operator's integration tests (tests/operator*.rs),
    //! and the interleavings they cannot stage on a real control plane.

    use std::collections::BTreeMap;

    use baton_api::AgentDeployment;
    use baton_resources::Credentials;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
    };

    use super::*;

    const UID: &str = "uid-of-bot";
    const RESYNC: Duration = Duration::from_secs(300);

    fn now() -> Timestamp {
        "2026-12-07T12:00:00Z".parse().unwrap()
    }

    fn seconds_ago(s: i64) -> Timestamp {
        Timestamp::from_second(now().as_second() - s).unwrap()
    }

    /// `bot` in `ns`, with `spec` (YAML, indented two spaces).
    fn resource(spec: &str) -> AgentDeployment {
        let yaml = format!(
            "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata:\n  name: bot\n  namespace: ns\n  uid: {UID}\n  generation: 3\nspec:\n{spec}"
        );
        serde_yaml::from_str(&yaml).expect("a test resource")
    }

    fn minimal() -> AgentDeployment {
        resource("  image: ghcr.io/acme/bot:1\n  replicas: 2\n")
    }

    fn settings() -> Settings {
        Settings {
            platform: Platform::default(),
            resync: RESYNC,
        }
    }

    fn credentials() -> Credentials {
        Credentials {
            redis_password: "r".into(),
            postgres_password: "p".into(),
            object_store_access_key_id: "k".into(),
            object_store_secret_access_key: "s".into(),
            admin_token: "t".into(),
        }
    }

    /// A valid resource against an empty cluster.
    fn world(agd: &AgentDeployment) -> World {
        let valid = baton_api::validate(agd).expect("a valid test resource");
        let credentials = credentials();
        World {
            desired: baton_resources::build(&valid, &credentials, &settings().platform),
            valid,
            credentials,
            external_secrets: Vec::new(),
            live: BTreeMap::new(),
            owned: Vec::new(),
            stores: Vec::new(),
            live_replicas: None,
            update_revision: None,
            pods: Vec::new(),
            probes: Vec::new(),
            layout_mismatch: None,
        }
    }

    fn observation(agd: AgentDeployment, stage: Stage) -> Observation {
        Observation {
            agd,
            now: now(),
            replicas: None,
            stage,
        }
    }

    fn valid(agd: &AgentDeployment, world: World) -> Observation {
        observation(agd.clone(), Stage::Valid(Box::new(world)))
    }

    fn pod(ordinal: i32, revision: &str, ready: bool) -> LivePod {
        LivePod {
            pod: ReplicaPod {
                name: format!("bot-{ordinal}"),
                uid: format!("pod-uid-{ordinal}"),
                ordinal,
                revision: Some(revision.into()),
                ready,
                terminating: false,
                created_at: Some(seconds_ago(600)),
                drain_started_at: None,
            },
            ip: Some(format!("10.0.0.{ordinal}")),
        }
    }

    fn draining(mut pod: LivePod, for_seconds: i64) -> LivePod {
        pod.pod.drain_started_at = Some(seconds_ago(for_seconds));
        pod
    }

    /// What the cluster holds once `decision`'s applies went through,
    /// each object recorded as verified (the operator saw it applied).
    fn applied(decision: &Decision, verified: &mut Verified) -> BTreeMap<ChildKey, ObjectMeta> {
        decision
            .apply
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut meta = a.object.metadata().clone();
                meta.uid = Some(format!("child-{i}"));
                meta.resource_version = Some("1".into());
                meta.owner_references = Some(vec![OwnerReference {
                    api_version: "baton.dev/v1alpha1".into(),
                    kind: "AgentDeployment".into(),
                    name: "bot".into(),
                    uid: UID.into(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]);
                verified.record(&meta);
                (a.key.clone(), meta)
            })
            .collect()
    }

    /// The cluster after a first reconcile of `agd` and the replicas at
    /// `revision`, all ready.
    fn settled(agd: &AgentDeployment, revision: &str) -> (World, Verified) {
        let mut verified = Verified::default();
        let first = decide(&valid(agd, world(agd)), &settings(), &verified);
        let live = applied(&first, &mut verified);
        let mut world = world(agd);
        world.owned = live.iter().map(|(k, m)| (k.kind, m.clone())).collect();
        world.live = live;
        world.live_replicas = Some(agd.spec.replicas);
        world.update_revision = Some(revision.into());
        world.pods = (0..agd.spec.replicas)
            .map(|o| pod(o, revision, true))
            .collect();
        (world, verified)
    }

    fn names(pods: &[LivePod]) -> Vec<&str> {
        pods.iter().map(|p| p.pod.name.as_str()).collect()
    }

    fn reasons(notes: &[Note]) -> Vec<&str> {
        notes.iter().map(|n| n.reason.as_str()).collect()
    }

    #[test]
    fn a_resource_being_deleted_is_left_to_the_garbage_collector() {
        let decision = decide(
            &observation(minimal(), Stage::Deleting),
            &settings(),
            &Verified::default(),
        );
        assert!(decision.apply.is_empty() && decision.prune.is_empty());
        assert!(decision.status.is_none() && decision.rollout.is_none());
        assert_eq!(decision.requeue, Requeue::AwaitChange);
        assert_eq!(decision.outcome, Outcome::Unchanged);
    }

    #[test]
    fn an_invalid_spec_changes_no_child_and_names_every_violation() {
        let violations = vec!["spec.replicas: must be >= 0".to_owned(), "spec.x: y".into()];
        let decision = decide(
            &observation(minimal(), Stage::Invalid(violations.clone())),
            &settings(),
            &Verified::default(),
        );
        assert!(decision.apply.is_empty() && decision.prune.is_empty());
        let status = decision.status.unwrap();
        assert_eq!(status.problem, Some(Problem::InvalidSpec(violations)));
        assert_eq!(status.generation, Some(3));
        assert_eq!(decision.requeue, Requeue::AwaitChange);
        assert_eq!(decision.outcome, Outcome::Invalid);
    }

    #[test]
    fn a_refused_service_account_is_looked_at_again_since_its_annotation_wakes_nothing() {
        let refusal = "spec.serviceAccountName: ServiceAccount ns/a does not exist".to_owned();
        let decision = decide(
            &observation(minimal(), Stage::AccountRefused(refusal.clone())),
            &settings(),
            &Verified::default(),
        );
        assert!(decision.apply.is_empty());
        assert_eq!(
            decision.status.unwrap().problem,
            Some(Problem::InvalidSpec(vec![refusal]))
        );
        assert_eq!(decision.requeue, Requeue::After(SERVICE_ACCOUNT_RECHECK));
    }

    #[test]
    fn a_new_resource_creates_every_child_in_apply_order_and_no_rollout_step() {
        let agd = minimal();
        let decision = decide(&valid(&agd, world(&agd)), &settings(), &Verified::default());
        assert!(decision.apply.len() >= 8, "{:?}", decision.apply);
        assert!(decision.apply.iter().all(|a| a.create));
        let kinds: Vec<ChildKind> = decision.apply.iter().map(|a| a.key.kind).collect();
        assert!(kinds.is_sorted(), "apply order: {kinds:?}");
        assert!(decision.prune.is_empty());
        // The replica StatefulSet is new: its revision comes first.
        assert!(decision.rollout.is_none());
        assert_eq!(reasons(&decision.children_events()), ["Created"]);
        assert_eq!(decision.outcome, Outcome::Applied);
        let status = decision.status.unwrap();
        assert_eq!(status.rollout.unwrap().phase, RolloutPhase::Progressing);
        assert_eq!(status.problem, None);
        assert!(status.selector.unwrap().contains("bot"));
    }

    #[test]
    fn a_resync_of_a_settled_resource_writes_nothing_and_waits_the_resync_interval() {
        let agd = minimal();
        let (world, verified) = settled(&agd, "rev-1");
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        assert!(decision.apply.is_empty(), "{:?}", decision.apply);
        assert!(decision.prune.is_empty() && decision.hand_over.is_empty());
        assert!(decision.children_events().is_empty());
        let rollout = decision.rollout.unwrap();
        assert!(rollout.drain.is_empty() && rollout.replace.is_empty());
        assert!(rollout.mark_draining.is_none());
        assert_eq!(decision.requeue, Requeue::After(RESYNC));
        assert_eq!(decision.outcome, Outcome::Unchanged);
        let status = decision.status.unwrap();
        assert_eq!(status.rollout.unwrap().phase, RolloutPhase::Complete);
        assert_eq!(status.current_revision.as_deref(), Some("rev-1"));
    }

    #[test]
    fn after_an_operator_restart_children_nobody_else_edited_are_not_applied_again() {
        let agd = minimal();
        let (mut world, _) = settled(&agd, "rev-1");
        // A new process remembers nothing; the managed fields say ours
        // is the last main-resource write.
        for meta in world.live.values_mut() {
            meta.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some(baton_api::constants::FIELD_MANAGER.into()),
                operation: Some("Apply".into()),
                time: Some(Time(seconds_ago(60))),
                ..ManagedFieldsEntry::default()
            }]);
        }
        let decision = decide(&valid(&agd, world), &settings(), &Verified::default());
        assert!(decision.apply.is_empty(), "{:?}", decision.apply);
    }

    #[test]
    fn a_child_someone_else_edited_since_our_apply_is_applied_again() {
        let agd = minimal();
        let (mut world, verified) = settled(&agd, "rev-1");
        let key = ChildKey {
            kind: ChildKind::ConfigMap,
            name: world
                .live
                .keys()
                .find(|k| k.kind == ChildKind::ConfigMap)
                .expect("a ConfigMap child")
                .name
                .clone(),
        };
        let meta = world.live.get_mut(&key).unwrap();
        meta.resource_version = Some("2".into());
        meta.managed_fields = Some(vec![
            ManagedFieldsEntry {
                manager: Some(baton_api::constants::FIELD_MANAGER.into()),
                operation: Some("Apply".into()),
                time: Some(Time(seconds_ago(60))),
                ..ManagedFieldsEntry::default()
            },
            ManagedFieldsEntry {
                manager: Some("kubectl-edit".into()),
                operation: Some("Update".into()),
                time: Some(Time(seconds_ago(5))),
                ..ManagedFieldsEntry::default()
            },
        ]);
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        let keys: Vec<&ChildKey> = decision.apply.iter().map(|a| &a.key).collect();
        assert_eq!(keys, [&key]);
        assert!(!decision.apply[0].create);
        assert_eq!(reasons(&decision.children_events()), ["Updated"]);
        assert_eq!(decision.outcome, Outcome::Applied);
    }

    #[test]
    fn external_stores_prune_the_managed_ones_last_first_and_wait_for_their_secrets() {
        let managed = minimal();
        let (settled_world, verified) = settled(&managed, "rev-1");
        let external = resource(
            "  image: ghcr.io/acme/bot:1\n  replicas: 2\n  dependencies:\n    redis:\n      external:\n        secretRef:\n          name: redis-url\n    postgres:\n      external:\n        secretRef:\n          name: pg-url\n    objectStore:\n      external:\n        secretRef:\n          name: s3\n        bucket: bot-files\n",
        );
        let mut world = world(&external);
        world.live = settled_world.live.clone();
        world.owned = settled_world.owned.clone();
        world.live_replicas = Some(2);
        world.update_revision = Some("rev-1".into());
        world.pods = settled_world.pods.clone();
        world.external_secrets = vec![
            ExternalSecret {
                name: "redis-url".into(),
                dependency: "redis",
                wanted: vec!["url".into()],
                present: None,
            },
            ExternalSecret {
                name: "pg-url".into(),
                dependency: "postgres",
                wanted: vec!["url".into()],
                present: Some(vec!["URL".into()]),
            },
            ExternalSecret {
                name: "s3".into(),
                dependency: "objectStore",
                wanted: vec!["endpoint".into(), "accessKeyId".into()],
                present: Some(vec!["endpoint".into(), "accessKeyId".into()]),
            },
        ];
        let decision = decide(&valid(&external, world), &settings(), &verified);
        let pruned: Vec<String> = decision.prune.iter().map(ToString::to_string).collect();
        assert!(
            pruned
                .iter()
                .any(|k| k.starts_with("StatefulSet/bot-redis")),
            "{pruned:?}"
        );
        assert!(pruned.iter().any(|k| k.starts_with("Job/")), "{pruned:?}");
        let kinds: Vec<ChildKind> = decision.prune.iter().map(|k| k.kind).collect();
        assert!(kinds.is_sorted_by(|a, b| a >= b), "prune order: {kinds:?}");
        assert!(reasons(&decision.children_events()).contains(&"Pruned"));
        let problem = decision.status.unwrap().problem.expect("a problem");
        assert_eq!(
            problem,
            Problem::ExternalSecretMissing(vec![
                "Secret ns/redis-url (spec.dependencies.redis.external.secretRef) does not exist".into(),
                "Secret ns/pg-url (spec.dependencies.postgres.external.secretRef) has no key \"url\"".into(),
            ])
        );
        assert_eq!(decision.requeue, Requeue::After(WAIT_FOR_SECRET));
    }

    #[test]
    fn a_new_template_updates_the_replica_stateful_set_before_any_pod_drains() {
        let agd = minimal();
        let (world, verified) = settled(&agd, "rev-1");
        let changed = resource("  image: ghcr.io/acme/bot:2\n  replicas: 2\n");
        let mut new_world = self::world(&changed);
        new_world.live = world.live;
        new_world.owned = world.owned;
        new_world.live_replicas = Some(2);
        new_world.update_revision = Some("rev-1".into());
        new_world.pods = world.pods;
        let mut observation = valid(&changed, new_world);
        observation.replicas = Some(crate::status::ReplicaObservation {
            up_to_date: true,
            ..Default::default()
        });
        let decision = decide(&observation, &settings(), &verified);
        assert!(
            decision.apply.iter().any(|a| a.key
                == ChildKey {
                    kind: ChildKind::StatefulSet,
                    name: "bot".into()
                }),
            "{:?}",
            decision.apply
        );
        assert!(
            decision.rollout.is_none(),
            "no drain before the new revision"
        );
        let status = decision.status.unwrap();
        let rollout = status.rollout.unwrap();
        assert_eq!(rollout.phase, RolloutPhase::Progressing);
        assert_eq!(
            rollout.message.as_deref(),
            Some("the replica StatefulSet is being updated")
        );
        assert!(status.stall.is_none());
        // The cached StatefulSet still shows the template before this apply.
        assert!(!status.replicas.unwrap().up_to_date);
    }

    #[test]
    fn an_old_revision_pod_is_listed_as_draining_in_the_status_before_it_is_drained() {
        let agd = minimal();
        let (mut world, verified) = settled(&agd, "rev-1");
        world.update_revision = Some("rev-2".into());
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        assert!(decision.apply.is_empty());
        let rollout = decision.rollout.unwrap();
        let drained: Vec<&str> = rollout
            .drain
            .iter()
            .map(|d| d.pod.pod.name.as_str())
            .collect();
        // The highest ordinal first, one at a time (maxUnavailable 1).
        assert_eq!(drained, ["bot-1"]);
        assert_eq!(rollout.drain[0].why, "revision rev-1 -> rev-2");
        let mark = rollout.mark_draining.expect("the status mark");
        let listed: Vec<&str> = mark.draining.iter().map(|d| d.pod.as_str()).collect();
        assert_eq!(listed, ["bot-1"]);
        assert_eq!(mark.draining[0].uid, "pod-uid-1");
        assert_eq!(
            draining_note(&rollout.drain[0], Some(1)),
            "draining bot-1 (revision rev-1 -> rev-2): 1 turn in flight"
        );
        assert_eq!(
            draining_note(&rollout.drain[0], None),
            "draining bot-1 (revision rev-1 -> rev-2): its sidecar did not answer"
        );
        assert_eq!(decision.requeue, Requeue::After(crate::rollout::DRAIN_POLL));
    }

    #[test]
    fn a_paused_rollout_drains_nothing_and_says_so_once() {
        let agd =
            resource("  image: ghcr.io/acme/bot:1\n  replicas: 2\n  rollout:\n    paused: true\n");
        let (mut world, verified) = settled(&agd, "rev-1");
        world.update_revision = Some("rev-2".into());
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        let rollout = decision.rollout.unwrap();
        assert!(rollout.drain.is_empty() && rollout.mark_draining.is_none());
        assert_eq!(reasons(&decision.events), ["RolloutPaused"]);
    }

    #[test]
    fn a_drained_pod_is_handed_over_and_replaced_with_the_sidecars_figures() {
        let agd = minimal();
        let (mut world, verified) = settled(&agd, "rev-1");
        world.update_revision = Some("rev-2".into());
        world.pods[1] = draining(world.pods[1].clone(), 3);
        world.probes = vec![(
            "bot-1".into(),
            DrainProbe::Drained {
                drained_in_ms: Some(120),
                aborted: 1,
            },
        )];
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        let rollout = decision.rollout.unwrap();
        assert!(rollout.drain.is_empty(), "one pod at a time");
        let replace = &rollout.replace[0];
        assert_eq!(replace.pod.pod.name, "bot-1");
        assert_eq!(replace.drained_in_ms, Some(120));
        assert_eq!(
            drained_note(replace, 2),
            "bot-1 drained in 120 ms, 3 turns handed over"
        );
        assert_eq!(
            deleted_note(replace),
            "deleted bot-1; the StatefulSet brings it back at revision rev-2"
        );
    }

    #[test]
    fn a_sidecar_that_never_said_how_long_its_drain_took_is_timed_from_the_mark() {
        let agd = minimal();
        let (mut world, verified) = settled(&agd, "rev-1");
        world.update_revision = Some("rev-2".into());
        let mut gone = draining(world.pods[1].clone(), 7);
        gone.pod.ready = false;
        world.pods[1] = gone;
        world.probes = vec![("bot-1".into(), DrainProbe::Unreachable)];
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        let replace = &decision.rollout.unwrap().replace[0];
        assert_eq!(replace.drained_in_ms, Some(7000));
        assert_eq!(
            drained_note(replace, 0),
            "bot-1 drained in 7000 ms, 0 turns handed over"
        );
    }

    #[test]
    fn a_sidecar_that_restarted_mid_drain_is_asked_again() {
        let agd = minimal();
        let (mut world, verified) = settled(&agd, "rev-1");
        world.update_revision = Some("rev-2".into());
        world.pods[1] = draining(world.pods[1].clone(), 1);
        world.probes = vec![("bot-1".into(), DrainProbe::NotDraining)];
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        let rollout = decision.rollout.unwrap();
        assert_eq!(names(&rollout.redrain), ["bot-1"]);
        assert!(rollout.replace.is_empty());
    }

    #[test]
    fn a_scale_down_keeps_the_surplus_pod_until_its_drain_is_over_then_hands_it_over() {
        let agd = resource("  image: ghcr.io/acme/bot:1\n  replicas: 1\n");
        let (two, verified) = settled(&minimal(), "rev-1");
        let mut world = world(&agd);
        world.live = two.live;
        world.owned = two.owned;
        world.live_replicas = Some(2);
        world.update_revision = Some("rev-1".into());
        world.pods = two.pods;

        // Still serving: drained first, and the StatefulSet keeps 2.
        let decision = decide(&valid(&agd, world.clone()), &settings(), &verified);
        assert!(decision.hand_over.is_empty());
        assert!(
            decision.apply.is_empty(),
            "the StatefulSet keeps its replicas while bot-1 drains"
        );
        let rollout = decision.rollout.unwrap();
        assert_eq!(rollout.drain[0].why, "scale-down");

        // Drained: its leases go back, then the StatefulSet shrinks.
        world.pods[1] = draining(world.pods[1].clone(), 2);
        world.probes = vec![(
            "bot-1".into(),
            DrainProbe::Drained {
                drained_in_ms: Some(5),
                aborted: 0,
            },
        )];
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        assert_eq!(names(&decision.hand_over), ["bot-1"]);
        let sts = decision
            .apply
            .iter()
            .find(|a| a.key.kind == ChildKind::StatefulSet && a.key.name == "bot")
            .expect("the replica StatefulSet shrinks");
        let ChildObject::StatefulSet(sts) = &sts.object else {
            panic!("a StatefulSet")
        };
        assert_eq!(sts.spec.as_ref().unwrap().replicas, Some(1));
    }

    #[test]
    fn the_pod_the_last_step_waited_for_is_announced_when_ready() {
        let mut agd = minimal();
        let (mut world, verified) = settled(&agd, "rev-1");
        world.update_revision = Some("rev-2".into());
        world.pods[1] = pod(1, "rev-2", true);
        world.pods[1].pod.created_at = Some(seconds_ago(4));
        agd.status = Some(baton_api::AgentDeploymentStatus {
            rollout: Some(RolloutStatus {
                phase: RolloutPhase::Progressing,
                revision: Some("rev-2".into()),
                step: Some(RolloutStep::WaitingReady),
                pod: Some("bot-1".into()),
                ..RolloutStatus::default()
            }),
            ..Default::default()
        });
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        let (pod, note) = decision.rollout.unwrap().ready.expect("a ready note");
        assert_eq!(pod.name, "bot-1");
        assert_eq!(
            note,
            "bot-1 is ready at revision rev-2 4000 ms after it was created"
        );
    }

    #[test]
    fn a_rollout_that_completes_is_announced_once() {
        let mut agd = minimal();
        let (world, verified) = settled(&agd, "rev-2");
        let progressing = RolloutStatus {
            phase: RolloutPhase::Progressing,
            revision: Some("rev-2".into()),
            ..RolloutStatus::default()
        };
        agd.status = Some(baton_api::AgentDeploymentStatus {
            rollout: Some(progressing),
            ..Default::default()
        });
        let decision = decide(&valid(&agd, world.clone()), &settings(), &verified);
        assert_eq!(reasons(&decision.events), ["RolloutComplete"]);
        assert_eq!(decision.events[0].note, "every replica runs revision rev-2");

        agd.status = Some(baton_api::AgentDeploymentStatus {
            rollout: decision.status.unwrap().rollout,
            ..Default::default()
        });
        let again = decide(&valid(&agd, world), &settings(), &verified);
        assert!(again.events.is_empty());
    }

    #[test]
    fn a_new_pod_not_ready_past_the_progress_deadline_stalls_the_rollout_with_a_warning() {
        let agd = resource(
            "  image: ghcr.io/acme/bot:1\n  replicas: 2\n  rollout:\n    progressDeadline: 60s\n",
        );
        let (mut world, verified) = settled(&agd, "rev-1");
        world.update_revision = Some("rev-2".into());
        world.pods[1] = pod(1, "rev-2", false);
        world.pods[1].pod.created_at = Some(seconds_ago(120));
        let decision = decide(&valid(&agd, world), &settings(), &verified);
        assert!(
            decision.rollout.unwrap().drain.is_empty(),
            "touches no other pod"
        );
        assert_eq!(decision.events.len(), 1);
        assert!(decision.events[0].warning);
        assert_eq!(decision.events[0].reason, "ProgressDeadlineExceeded");
        assert!(decision.status.unwrap().stall.is_some());
    }

    #[test]
    fn a_problem_is_announced_when_it_appears_or_changes_not_on_every_resync() {
        let problem = Problem::ExternalSecretMissing(vec!["Secret ns/a does not exist".into()]);
        let first = problem_event(None, Some(&problem)).expect("announced");
        assert!(first.warning);
        assert_eq!(first.reason, "ExternalSecretMissing");
        let observed = Observed {
            problem: Some(problem.clone()),
            ..Observed::default()
        };
        let reported = status::compute(&observed, None, &Time(now()));
        assert_eq!(problem_event(Some(&reported), Some(&problem)), None);
        let other = Problem::ExternalSecretMissing(vec!["Secret ns/b does not exist".into()]);
        assert!(problem_event(Some(&reported), Some(&other)).is_some());
        assert_eq!(problem_event(Some(&reported), None), None);
    }
}
