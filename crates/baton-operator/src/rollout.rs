//! The rolling release, as a pure function: from the replica pods (their
//! revision, readiness and whether the status lists them as draining), what
//! their sidecars said when asked, and the previous `status.rollout`,
//! decide which pods to start draining, which drained pods to replace, how
//! many replicas the StatefulSet may have, and the new `status.rollout`.
//!
//! Each reconcile runs one step; nothing is kept in memory between them.
//! The state is in the API: `status.rollout.draining` lists the pods being
//! drained (written before their sidecars are asked, so the operator needs
//! no right to patch pods), a replaced pod comes back from the StatefulSet
//! controller with the update revision's label, and the status says when
//! the rollout began. An operator that restarts, or a new leader, reads the
//! same objects and takes the same next step; a pod is deleted only once it
//! is listed as draining and its drain is over.
//!
//! The order: pods that are not ready first (they serve nothing), then the
//! highest ordinal first, as the StatefulSet controller would. At most
//! `maxUnavailable` replicas are out at once (not ready, draining, or
//! missing); a pod that is already not ready is replaced without waiting
//! for that budget, or a rollout that fixes a broken version could never
//! start. Scaling down drains the pods it removes before the StatefulSet
//! loses them.

use std::collections::BTreeSet;
use std::time::Duration;

use baton_api::{DrainingPod, RolloutPhase, RolloutStatus, RolloutStep};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// How long after a drain's own timeout the rollout replaces a pod whose
/// sidecar still reports turns in flight (the sidecar aborts them at its
/// timeout; this covers one that does not answer or did not).
pub const DRAIN_GRACE: Duration = Duration::from_secs(15);

/// Condition reason of a rollout stopped by a pod that did not become ready.
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

/// Condition reason of a rollout refused because the new sidecar writes
/// another data layout than the stores hold.
pub const LAYOUT_INCOMPATIBLE: &str = "LayoutIncompatible";

/// A new pod whose sidecar serves nothing: the stores hold another data
/// layout than it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutMismatch {
    pub pod: String,
    pub layout: u32,
    pub store_layout: u32,
}

/// One replica pod, as the rollout sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaPod {
    pub name: String,
    pub uid: String,
    pub ordinal: i32,
    /// Its `controller-revision-hash` label.
    pub revision: Option<String>,
    pub ready: bool,
    /// It has a deletion timestamp: already on its way out.
    pub terminating: bool,
    pub created_at: Option<Timestamp>,
    /// When the rollout began draining it (`status.rollout.draining`).
    pub drain_started_at: Option<Timestamp>,
}

/// What a draining pod's sidecar said (`GET /v1/admin/status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainProbe {
    /// Draining and no turn runs.
    Drained {
        /// How long the drain took, as the sidecar measured it.
        drained_in_ms: Option<u64>,
        /// Turns aborted at the drain timeout (their sessions moved on).
        aborted: u64,
    },
    /// Draining; turns still run.
    Draining { in_flight: u64 },
    /// Answers but is not draining (restarted, or the drain request was
    /// lost): drain it again.
    NotDraining,
    /// Did not answer.
    Unreachable,
}

/// Everything one step is decided from.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// `spec.replicas`.
    pub desired: i32,
    /// The StatefulSet's `spec.replicas` as last applied, if it exists.
    pub live_replicas: Option<i32>,
    /// The StatefulSet's update revision, once its controller has seen the
    /// latest template.
    pub update_revision: Option<&'a str>,
    pub pods: &'a [ReplicaPod],
    /// The answers of the sidecars of the pods listed as draining.
    pub probes: &'a [(String, DrainProbe)],
    pub paused: bool,
    pub max_unavailable: i32,
    pub progress_deadline: Duration,
    pub drain_timeout: Duration,
    pub previous: Option<&'a RolloutStatus>,
    pub now: Timestamp,
    /// What a new pod's sidecar said of the layouts, when they differ.
    pub layout_mismatch: Option<&'a LayoutMismatch>,
    /// `spec.rollout.migrateLayout`.
    pub migrate_layout: bool,
}

/// Why the rollout cannot go on by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    pub reason: &'static str,
    pub message: String,
}

/// One step.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Pods to annotate and drain now.
    pub drain: Vec<String>,
    /// Drained pods to hand over and delete now (the StatefulSet brings
    /// them back at the update revision).
    pub replace: Vec<String>,
    /// Drained pods the scale-down removes: hand over, then the StatefulSet
    /// loses them with `statefulset_replicas`.
    pub release: Vec<String>,
    /// Draining pods whose sidecar is not draining: ask again.
    pub redrain: Vec<String>,
    /// The StatefulSet's `spec.replicas`: the desired count, or the live
    /// one while the pods a scale-down removes are still draining.
    pub statefulset_replicas: i32,
    pub status: RolloutStatus,
    pub stall: Option<Stall>,
    /// The revision every replica runs, when they all run one.
    pub current_revision: Option<String>,
    /// When to look again (drains are polled; pod changes wake the
    /// controller through the watch).
    pub requeue: Option<Duration>,
}

/// How often a drain in progress is looked at.
pub const DRAIN_POLL: Duration = Duration::from_millis(250);
/// How often a rollout waiting for a pod is looked at (readiness changes
/// arrive through the pod watch anyway; this bounds a missed one).
pub const PROGRESS_POLL: Duration = Duration::from_secs(2);

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let ms = now.as_millisecond().saturating_sub(since.as_millisecond());
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A status time: whole seconds, as the API server stores it, so that a
/// status read back compares equal to the one written (a drain started at
/// a sub-second instant would otherwise rewrite the status at every poll).
pub fn time(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).expect("a second of a valid time is valid"))
}

fn probe_of<'a>(probes: &'a [(String, DrainProbe)], pod: &str) -> Option<&'a DrainProbe> {
    probes.iter().find(|(name, _)| name == pod).map(|(_, p)| p)
}

/// Whether the drain of `pod` is over: its sidecar says no turn runs, or
/// it does not answer and the kubelet agrees it serves nothing, or the
/// drain has run past its timeout and the grace.
fn drain_over(inputs: &Inputs<'_>, pod: &ReplicaPod) -> bool {
    let Some(started) = pod.drain_started_at else {
        return false;
    };
    let past_deadline = elapsed(started, inputs.now) > inputs.drain_timeout + DRAIN_GRACE;
    match probe_of(inputs.probes, &pod.name) {
        Some(DrainProbe::Drained { .. }) => true,
        Some(DrainProbe::Unreachable) | None => !pod.ready || past_deadline,
        Some(DrainProbe::Draining { .. } | DrainProbe::NotDraining) => past_deadline,
    }
}

/// The next step of the rollout (and of a scale-down), with the pods it
/// drains after this step in `status.draining`.
pub fn plan(inputs: &Inputs<'_>) -> Plan {
    let mut plan = step(inputs);
    plan.status.draining = draining_after(inputs.pods, &plan.drain, inputs.now);
    plan
}

/// The pods being drained once `drain` begins: those already draining that
/// still exist, and the new ones.
fn draining_after(pods: &[ReplicaPod], drain: &[String], now: Timestamp) -> Vec<DrainingPod> {
    let mut out: Vec<DrainingPod> = pods
        .iter()
        .filter_map(|p| {
            let since = p
                .drain_started_at
                .or_else(|| drain.contains(&p.name).then_some(now))?;
            Some(DrainingPod {
                pod: p.name.clone(),
                uid: p.uid.clone(),
                since: time(since),
            })
        })
        .collect();
    out.sort_by(|a, b| a.pod.cmp(&b.pod));
    out
}

fn step(inputs: &Inputs<'_>) -> Plan {
    let desired = inputs.desired.max(0);
    let previous = inputs.previous;
    let live: Vec<&ReplicaPod> = inputs.pods.iter().filter(|p| !p.terminating).collect();
    let mut plan = Plan {
        drain: Vec::new(),
        replace: Vec::new(),
        release: Vec::new(),
        redrain: Vec::new(),
        statefulset_replicas: desired,
        status: previous.cloned().unwrap_or_default(),
        stall: None,
        current_revision: None,
        requeue: None,
    };
    let draining = |p: &ReplicaPod| p.drain_started_at.is_some();
    for pod in live.iter().filter(|p| draining(p)) {
        if matches!(
            probe_of(inputs.probes, &pod.name),
            Some(DrainProbe::NotDraining)
        ) {
            plan.redrain.push(pod.name.clone());
        }
    }

    // Scale-down: the pods above the desired count drain first; the
    // StatefulSet keeps them until every one of them is over.
    let surplus: Vec<&ReplicaPod> = live
        .iter()
        .copied()
        .filter(|p| p.ordinal >= desired)
        .collect();
    let live_replicas = inputs.live_replicas.unwrap_or(desired);
    if live_replicas > desired && !surplus.is_empty() {
        plan.drain.extend(
            surplus
                .iter()
                .filter(|p| p.drain_started_at.is_none())
                .map(|p| p.name.clone()),
        );
        if surplus.iter().all(|p| drain_over(inputs, p)) {
            plan.release = surplus.iter().map(|p| p.name.clone()).collect();
        } else {
            plan.statefulset_replicas = live_replicas;
            plan.requeue = Some(DRAIN_POLL);
        }
    }

    let Some(update) = inputs.update_revision else {
        // The StatefulSet controller has not seen the template yet.
        plan.status.message = Some("waiting for the StatefulSet controller".into());
        plan.requeue = Some(PROGRESS_POLL);
        return plan;
    };
    let in_scope: Vec<&ReplicaPod> = live
        .iter()
        .copied()
        .filter(|p| p.ordinal < desired)
        .collect();
    let is_updated = |p: &ReplicaPod| p.revision.as_deref() == Some(update);
    let serving_updated = |p: &ReplicaPod| is_updated(p) && p.ready && p.drain_started_at.is_none();
    let present: BTreeSet<i32> = in_scope.iter().map(|p| p.ordinal).collect();
    let missing = (0..desired).filter(|o| !present.contains(o)).count() as i32;
    let updated = in_scope.iter().filter(|p| serving_updated(p)).count() as i32;

    // Replace the pods whose drain is over.
    for pod in in_scope.iter().filter(|p| draining(p)) {
        if drain_over(inputs, pod) {
            plan.replace.push(pod.name.clone());
        } else {
            plan.requeue = Some(DRAIN_POLL);
        }
    }

    // A new pod that is not ready within the progress deadline stops the rollout.
    let late = in_scope.iter().find(|p| {
        is_updated(p)
            && !p.ready
            && p.drain_started_at.is_none()
            && p.created_at
                .is_some_and(|c| elapsed(c, inputs.now) > inputs.progress_deadline)
    });
    let old: Vec<&ReplicaPod> = {
        let mut old: Vec<&ReplicaPod> = in_scope
            .iter()
            .copied()
            .filter(|p| !is_updated(p) && p.drain_started_at.is_none())
            .collect();
        old.sort_by_key(|p| (p.ready, std::cmp::Reverse(p.ordinal)));
        old
    };

    let mismatch = inputs
        .layout_mismatch
        .filter(|m| in_scope.iter().any(|p| p.name == m.pod && is_updated(p)));
    if let Some(m) = mismatch.filter(|_| !inputs.migrate_layout) {
        plan.stall = Some(Stall {
            reason: LAYOUT_INCOMPATIBLE,
            message: format!(
                "pod {} of revision {update} writes data layout {} but the stores hold layout {}: replicas of two layouts must not share a Redis, so it serves nothing and the rollout stopped. Roll back, or set spec.rollout.migrateLayout: true to replace every old replica at once",
                m.pod, m.layout, m.store_layout
            ),
        });
        plan.replace.clear();
        plan.drain
            .retain(|name| surplus.iter().any(|p| &p.name == name));
    } else if let Some(m) = mismatch {
        // Migrating: the new layout takes the stores once no old replica
        // is alive, so every old one goes now, whatever the budget.
        plan.drain.extend(old.iter().map(|p| p.name.clone()));
        plan.status.message = Some(format!(
            "migrating the stores from data layout {} to {}: every old replica is replaced at once; sessions wait until the new ones serve",
            m.store_layout, m.layout
        ));
    } else if let Some(pod) = late {
        plan.stall = Some(Stall {
            reason: PROGRESS_DEADLINE_EXCEEDED,
            message: format!(
                "pod {} of revision {update} is not ready after the progress deadline ({}); the rollout stopped and touches no other pod. Fix the spec (or its image) to go on",
                pod.name,
                baton_api::validate::format_duration(inputs.progress_deadline)
            ),
        });
        // Touch nothing: no drain finishes into a deletion, none starts.
        plan.replace.clear();
        plan.drain
            .retain(|name| surplus.iter().any(|p| &p.name == name));
    } else if !inputs.paused {
        let unavailable = in_scope
            .iter()
            .filter(|p| !p.ready || p.drain_started_at.is_some())
            .count() as i32
            + missing;
        let mut budget = inputs.max_unavailable.max(1) - unavailable;
        for pod in &old {
            if !pod.ready {
                // Already out: replacing it costs nothing.
                plan.drain.push(pod.name.clone());
            } else if budget > 0 {
                budget -= 1;
                plan.drain.push(pod.name.clone());
            }
        }
    }
    if !plan.drain.is_empty() {
        plan.requeue = Some(DRAIN_POLL);
    }

    // The status.
    let complete = old.is_empty()
        && updated == desired
        && in_scope.iter().all(|p| p.drain_started_at.is_none());
    let same_rollout = previous.is_some_and(|p| p.revision.as_deref() == Some(update));
    let migrating = plan.status.message.take().filter(|_| mismatch.is_some());
    let status = &mut plan.status;
    if !same_rollout {
        status.started_at = None;
        status.last_step = None;
    }
    status.revision = Some(update.to_owned());
    status.updated = updated;
    status.total = desired;
    status.pod = None;
    status.step = None;
    status.step_started_at = None;
    status.message = None;
    if complete {
        status.phase = RolloutPhase::Complete;
        plan.current_revision = Some(update.to_owned());
    } else {
        if status.started_at.is_none() {
            status.started_at = Some(time(inputs.now));
        }
        // The pod being worked on: a drain first, else a new pod starting.
        let draining_pod = in_scope
            .iter()
            .find(|p| p.drain_started_at.is_some())
            .or_else(|| {
                plan.drain
                    .first()
                    .and_then(|n| in_scope.iter().find(|p| &p.name == n))
            });
        let starting = in_scope.iter().find(|p| is_updated(p) && !p.ready);
        if let Some(pod) = draining_pod {
            let replacing = plan.replace.contains(&pod.name);
            status.pod = Some(pod.name.clone());
            status.step = Some(if replacing {
                RolloutStep::Replacing
            } else {
                RolloutStep::Draining
            });
            status.step_started_at = Some(time(pod.drain_started_at.unwrap_or(inputs.now)));
        } else if let Some(pod) = starting {
            status.pod = Some(pod.name.clone());
            status.step = Some(RolloutStep::WaitingReady);
            status.step_started_at = pod.created_at.map(time);
        }
        status.phase = if plan.stall.is_some() {
            RolloutPhase::Stalled
        } else if inputs.paused
            && plan.drain.is_empty()
            && plan.replace.is_empty()
            && starting.is_none()
            && draining_pod.is_none()
            // A pod replaced just before the pause is not back yet: the
            // rollout still finishes that one, so it is not between pods.
            && missing == 0
        {
            RolloutPhase::Paused
        } else {
            RolloutPhase::Progressing
        };
        status.message = match (&plan.stall, status.phase) {
            (Some(stall), _) => Some(stall.message.clone()),
            (None, RolloutPhase::Paused) => Some(format!(
                "paused with {updated}/{desired} replicas at revision {update}; resume with `baton rollout resume` or spec.rollout.paused: false"
            )),
            _ => migrating,
        };
        if plan.requeue.is_none() {
            plan.requeue = Some(PROGRESS_POLL);
        }
        // The deadline itself must wake the controller.
        if let Some(pod) = starting
            && let Some(created) = pod.created_at
        {
            let left = inputs
                .progress_deadline
                .saturating_sub(elapsed(created, inputs.now))
                + Duration::from_millis(100);
            plan.requeue = plan.requeue.map(|r| r.min(left));
        }
    }
    if !complete && plan.current_revision.is_none() {
        plan.current_revision = previous_current(inputs, update);
    }
    plan
}

/// The revision the replicas ran before this rollout: the one most of the
/// pods not yet updated carry.
fn previous_current(inputs: &Inputs<'_>, update: &str) -> Option<String> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for pod in inputs.pods {
        if let Some(r) = pod.revision.as_deref()
            && r != update
        {
            match counts.iter_mut().find(|(rev, _)| *rev == r) {
                Some((_, n)) => *n += 1,
                None => counts.push((r, 1)),
            }
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(r, _)| r.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "demo-aaa";
    const NEW: &str = "demo-bbb";

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn pod(ordinal: i32, revision: &str, ready: bool) -> ReplicaPod {
        ReplicaPod {
            name: format!("demo-{ordinal}"),
            uid: format!("uid-{ordinal}-{revision}"),
            ordinal,
            revision: Some(revision.into()),
            ready,
            terminating: false,
            created_at: Some(at(0)),
            drain_started_at: None,
        }
    }

    fn draining(mut p: ReplicaPod, since: i64) -> ReplicaPod {
        p.drain_started_at = Some(at(since));
        p.ready = false;
        p
    }

    struct Case {
        pods: Vec<ReplicaPod>,
        probes: Vec<(String, DrainProbe)>,
        desired: i32,
        live: i32,
        paused: bool,
        max_unavailable: i32,
        now: i64,
        previous: Option<RolloutStatus>,
        layout_mismatch: Option<LayoutMismatch>,
        migrate_layout: bool,
    }

    impl Case {
        fn new(pods: Vec<ReplicaPod>) -> Self {
            Self {
                desired: pods.len() as i32,
                live: pods.len() as i32,
                pods,
                probes: Vec::new(),
                paused: false,
                max_unavailable: 1,
                now: 100,
                previous: None,
                layout_mismatch: None,
                migrate_layout: false,
            }
        }

        fn plan(&self) -> Plan {
            plan(&Inputs {
                desired: self.desired,
                live_replicas: Some(self.live),
                update_revision: Some(NEW),
                pods: &self.pods,
                probes: &self.probes,
                paused: self.paused,
                max_unavailable: self.max_unavailable,
                progress_deadline: Duration::from_secs(600),
                drain_timeout: Duration::from_secs(60),
                previous: self.previous.as_ref(),
                now: at(self.now),
                layout_mismatch: self.layout_mismatch.as_ref(),
                migrate_layout: self.migrate_layout,
            })
        }
    }

    fn drained() -> DrainProbe {
        DrainProbe::Drained {
            drained_in_ms: Some(40),
            aborted: 0,
        }
    }

    #[test]
    fn the_status_lists_every_draining_pod_with_its_uid_before_the_drain() {
        const OLD: &str = "demo-aaa";
        // demo-2 drains since 40; the plan starts nothing else meanwhile.
        let mut case = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            draining(pod(2, OLD, true), 40),
        ]);
        case.probes = vec![("demo-2".into(), DrainProbe::Draining { in_flight: 1 })];
        let plan = case.plan();
        assert!(plan.drain.is_empty());
        let listed: Vec<_> = plan
            .status
            .draining
            .iter()
            .map(|d| (d.pod.as_str(), d.uid.as_str(), d.since.clone()))
            .collect();
        assert_eq!(listed, [("demo-2", "uid-2-demo-aaa", time(at(40)))]);

        // Nothing draining: the plan starts demo-2 and lists it, since now.
        let plan = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            pod(2, OLD, true),
        ])
        .plan();
        assert_eq!(plan.drain, ["demo-2"]);
        assert_eq!(plan.status.draining.len(), 1);
        assert_eq!(
            (
                plan.status.draining[0].pod.as_str(),
                &plan.status.draining[0].since
            ),
            ("demo-2", &time(at(100)))
        );

        // A drained pod that is gone leaves the list.
        let plan = Case::new(vec![pod(0, OLD, true), pod(1, OLD, true)]).plan();
        assert!(plan.status.draining.iter().all(|d| d.pod != "demo-2"));
    }

    #[test]
    fn an_up_to_date_set_is_complete_and_touches_nothing() {
        let plan = Case::new(vec![pod(0, NEW, true), pod(1, NEW, true)]).plan();
        assert!(plan.drain.is_empty() && plan.replace.is_empty());
        assert_eq!(plan.status.phase, RolloutPhase::Complete);
        assert_eq!(plan.status.updated, 2);
        assert_eq!(plan.current_revision.as_deref(), Some(NEW));
        assert_eq!(plan.requeue, None);
    }

    #[test]
    fn a_new_revision_drains_the_highest_ordinal_first_one_at_a_time() {
        let plan = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            pod(2, OLD, true),
        ])
        .plan();
        assert_eq!(plan.drain, ["demo-2"]);
        assert!(plan.replace.is_empty());
        assert_eq!(plan.status.phase, RolloutPhase::Progressing);
        assert_eq!(plan.status.pod.as_deref(), Some("demo-2"));
        assert_eq!(plan.status.step, Some(RolloutStep::Draining));
        assert_eq!(plan.status.started_at, Some(time(at(100))));
        assert_eq!(plan.current_revision.as_deref(), Some(OLD));
    }

    #[test]
    fn max_unavailable_bounds_the_drains_at_once() {
        let mut case = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            pod(2, OLD, true),
        ]);
        case.max_unavailable = 2;
        assert_eq!(case.plan().drain, ["demo-2", "demo-1"]);
    }

    #[test]
    fn a_pod_is_replaced_only_once_its_drain_is_over() {
        let pods = vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            draining(pod(2, OLD, true), 90),
        ];
        let mut case = Case::new(pods);
        case.probes = vec![("demo-2".into(), DrainProbe::Draining { in_flight: 2 })];
        let plan = case.plan();
        assert!(plan.replace.is_empty(), "{plan:?}");
        assert!(plan.drain.is_empty(), "one at a time: {plan:?}");
        assert_eq!(plan.requeue, Some(DRAIN_POLL));
        case.probes = vec![("demo-2".into(), drained())];
        let plan = case.plan();
        assert_eq!(plan.replace, ["demo-2"]);
        assert_eq!(plan.status.step, Some(RolloutStep::Replacing));
    }

    #[test]
    fn a_silent_sidecar_is_replaced_when_not_ready_or_after_the_drain_deadline() {
        let mut ready_but_silent = draining(pod(2, OLD, true), 90);
        ready_but_silent.ready = true;
        let mut case = Case::new(vec![pod(0, OLD, true), pod(1, OLD, true), ready_but_silent]);
        case.probes = vec![("demo-2".into(), DrainProbe::Unreachable)];
        assert!(
            case.plan().replace.is_empty(),
            "a ready pod may still serve"
        );
        case.now = 90 + 60 + 16;
        assert_eq!(case.plan().replace, ["demo-2"]);
        case.pods[2].ready = false;
        case.now = 91;
        assert_eq!(case.plan().replace, ["demo-2"]);
    }

    #[test]
    fn a_turn_past_the_drain_timeout_does_not_hold_the_rollout_forever() {
        let mut case = Case::new(vec![pod(0, OLD, true), draining(pod(1, OLD, true), 0)]);
        case.probes = vec![("demo-1".into(), DrainProbe::Draining { in_flight: 1 })];
        case.now = 60;
        assert!(case.plan().replace.is_empty());
        case.now = 76;
        assert_eq!(case.plan().replace, ["demo-1"]);
    }

    #[test]
    fn the_next_pod_waits_until_the_replaced_one_is_ready() {
        let mut fresh = pod(2, NEW, false);
        fresh.created_at = Some(at(95));
        let plan = Case::new(vec![pod(0, OLD, true), pod(1, OLD, true), fresh]).plan();
        assert!(plan.drain.is_empty(), "{plan:?}");
        assert_eq!(plan.status.step, Some(RolloutStep::WaitingReady));
        assert_eq!(plan.status.pod.as_deref(), Some("demo-2"));
        let plan = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            pod(2, NEW, true),
        ])
        .plan();
        assert_eq!(plan.drain, ["demo-1"]);
        assert_eq!(plan.status.updated, 1);
    }

    #[test]
    fn a_missing_pod_counts_as_unavailable() {
        let plan = Case {
            desired: 3,
            ..Case::new(vec![pod(0, OLD, true), pod(1, OLD, true)])
        }
        .plan();
        assert!(plan.drain.is_empty(), "{plan:?}");
    }

    #[test]
    fn a_pod_late_past_the_progress_deadline_stalls_the_rollout_and_touches_nothing_else() {
        let mut case = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            pod(2, NEW, false),
        ]);
        case.now = 601;
        let plan = case.plan();
        assert!(plan.drain.is_empty() && plan.replace.is_empty(), "{plan:?}");
        assert_eq!(plan.status.phase, RolloutPhase::Stalled);
        let stall = plan.stall.unwrap();
        assert_eq!(stall.reason, PROGRESS_DEADLINE_EXCEEDED);
        assert!(stall.message.contains("demo-2"), "{}", stall.message);
        case.now = 599;
        let plan = case.plan();
        assert_eq!(plan.status.phase, RolloutPhase::Progressing);
        assert!(
            plan.requeue.unwrap() <= Duration::from_millis(1100),
            "{plan:?}"
        );
    }

    #[test]
    fn fixing_a_broken_version_replaces_the_broken_pod_first_without_a_budget() {
        // demo-2 runs the broken revision (now "OLD" against the fix NEW).
        let plan = Case::new(vec![
            pod(0, "v1", true),
            pod(1, "v1", true),
            pod(2, OLD, false),
        ])
        .plan();
        assert_eq!(plan.drain, ["demo-2"]);
    }

    #[test]
    fn a_new_sidecar_of_another_layout_stops_the_rollout_unless_the_spec_migrates() {
        let mut case = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            pod(2, NEW, false),
        ]);
        case.layout_mismatch = Some(LayoutMismatch {
            pod: "demo-2".into(),
            layout: 3,
            store_layout: 2,
        });
        let plan = case.plan();
        assert!(plan.drain.is_empty(), "{plan:?}");
        assert_eq!(plan.status.phase, RolloutPhase::Stalled);
        let stall = plan.stall.unwrap();
        assert_eq!(stall.reason, LAYOUT_INCOMPATIBLE);
        assert!(stall.message.contains("layout 3") && stall.message.contains("migrateLayout"));
        case.migrate_layout = true;
        let plan = case.plan();
        assert_eq!(plan.drain, ["demo-1", "demo-0"], "every old pod at once");
        assert!(plan.stall.is_none());
        assert!(plan.status.message.unwrap().contains("migrating"));
    }

    #[test]
    fn paused_stops_between_pods_but_finishes_the_current_one() {
        let mut case = Case::new(vec![
            pod(0, OLD, true),
            pod(1, OLD, true),
            pod(2, NEW, true),
        ]);
        case.paused = true;
        let plan = case.plan();
        assert!(plan.drain.is_empty());
        assert_eq!(plan.status.phase, RolloutPhase::Paused);
        assert!(plan.status.message.unwrap().contains("1/3"));
        case.pods[1] = draining(pod(1, OLD, true), 99);
        case.probes = vec![("demo-1".into(), drained())];
        let plan = case.plan();
        assert_eq!(plan.replace, ["demo-1"]);
        assert_eq!(plan.status.phase, RolloutPhase::Progressing);
    }

    #[test]
    fn paused_right_after_a_replacement_is_paused_only_once_the_pod_is_back_and_ready() {
        // demo-1 was deleted for the rollout just before the pause: the
        // StatefulSet has not recreated it yet.
        let mut case = Case::new(vec![pod(0, OLD, true), pod(2, NEW, true)]);
        case.desired = 3;
        case.live = 3;
        case.paused = true;
        let plan = case.plan();
        assert!(plan.drain.is_empty());
        assert_eq!(plan.status.phase, RolloutPhase::Progressing);
        // Back, starting at the new revision.
        case.pods.insert(1, pod(1, NEW, false));
        let plan = case.plan();
        assert_eq!(plan.status.phase, RolloutPhase::Progressing);
        assert_eq!(plan.status.step, Some(RolloutStep::WaitingReady));
        // Ready: now it stops between pods.
        case.pods[1].ready = true;
        let plan = case.plan();
        assert!(plan.drain.is_empty());
        assert_eq!(plan.status.phase, RolloutPhase::Paused);
        assert!(plan.status.message.unwrap().contains("2/3"));
    }

    #[test]
    fn status_times_are_whole_seconds_so_a_read_back_status_compares_equal() {
        let mut p = draining(pod(1, OLD, true), 0);
        p.drain_started_at =
            Some(Timestamp::from_millisecond(at(99).as_millisecond() + 456).unwrap());
        let mut case = Case::new(vec![pod(0, OLD, true), p]);
        case.probes = vec![("demo-1".into(), DrainProbe::Draining { in_flight: 1 })];
        let plan = case.plan();
        assert_eq!(plan.status.step_started_at, Some(Time(at(99))));
    }

    #[test]
    fn a_restarted_sidecar_under_a_drain_annotation_is_drained_again() {
        let mut case = Case::new(vec![pod(0, OLD, true), draining(pod(1, OLD, true), 99)]);
        case.probes = vec![("demo-1".into(), DrainProbe::NotDraining)];
        let plan = case.plan();
        assert_eq!(plan.redrain, ["demo-1"]);
        assert!(plan.replace.is_empty());
    }

    #[test]
    fn a_rollback_mid_drain_still_replaces_the_drained_pod() {
        // demo-2 was drained for NEW; the spec went back to its revision.
        let mut case = Case::new(vec![
            pod(0, NEW, true),
            pod(1, NEW, true),
            draining(pod(2, NEW, true), 99),
        ]);
        case.probes = vec![("demo-2".into(), drained())];
        let plan = case.plan();
        assert_eq!(plan.replace, ["demo-2"]);
        assert_ne!(plan.status.phase, RolloutPhase::Complete);
    }

    #[test]
    fn scale_down_drains_the_removed_pods_before_the_statefulset_shrinks() {
        let mut case = Case::new(vec![
            pod(0, NEW, true),
            pod(1, NEW, true),
            pod(2, NEW, true),
        ]);
        case.desired = 1;
        let plan = case.plan();
        assert_eq!(plan.drain, ["demo-1", "demo-2"]);
        assert_eq!(plan.statefulset_replicas, 3);
        case.pods[1] = draining(pod(1, NEW, true), 99);
        case.pods[2] = draining(pod(2, NEW, true), 99);
        case.probes = vec![
            ("demo-1".into(), drained()),
            ("demo-2".into(), DrainProbe::Draining { in_flight: 1 }),
        ];
        let plan = case.plan();
        assert!(plan.drain.is_empty() && plan.release.is_empty());
        assert_eq!(plan.statefulset_replicas, 3);
        case.probes[1].1 = drained();
        let plan = case.plan();
        assert_eq!(plan.release, ["demo-1", "demo-2"]);
        assert_eq!(plan.statefulset_replicas, 1);
        assert!(plan.replace.is_empty(), "removed pods are not replaced");
        assert_eq!(plan.status.phase, RolloutPhase::Complete);
    }

    #[test]
    fn scale_up_is_no_rollout() {
        let mut case = Case::new(vec![pod(0, NEW, true)]);
        case.desired = 3;
        let plan = case.plan();
        assert_eq!(plan.statefulset_replicas, 3);
        assert!(plan.drain.is_empty());
    }

    #[test]
    fn the_rollout_keeps_its_start_time_across_steps_and_resets_on_a_new_revision() {
        let mut case = Case::new(vec![pod(0, OLD, true), pod(1, NEW, true)]);
        case.previous = Some(RolloutStatus {
            revision: Some(NEW.into()),
            started_at: Some(time(at(5))),
            last_step: Some("drained demo-1".into()),
            ..RolloutStatus::default()
        });
        let plan = case.plan();
        assert_eq!(plan.status.started_at, Some(time(at(5))));
        assert_eq!(plan.status.last_step.as_deref(), Some("drained demo-1"));
        case.previous.as_mut().unwrap().revision = Some("demo-zzz".into());
        let plan = case.plan();
        assert_eq!(plan.status.started_at, Some(time(at(100))));
        assert_eq!(plan.status.last_step, None);
    }
}
