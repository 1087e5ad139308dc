//! The status of an `AgentDeployment`, as a pure function of what the
//! operator observed. Conditions follow the Kubernetes API conventions: each
//! has a status, a CamelCase reason, a message and a `lastTransitionTime`
//! that moves only when the status does.

use baton_api::{AgentDeploymentStatus, RolloutPhase, RolloutStatus, condition_types};

use crate::rollout::Stall;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// What stops an `AgentDeployment` from being what its spec says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The object could not be read as an `AgentDeployment` at all.
    MalformedObject(String),
    /// The spec breaks rules (every violation, `field: message`).
    InvalidSpec(Vec<String>),
    /// External store Secrets that are missing or lack a key.
    ExternalSecretMissing(Vec<String>),
    /// The API server refused a write.
    ApplyFailed(String),
    /// A watch has not delivered its first list (often a missing right).
    WatchNotReady(String),
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MalformedObject(_) => "MalformedObject",
            Self::InvalidSpec(_) => "InvalidSpec",
            Self::ExternalSecretMissing(_) => "ExternalSecretMissing",
            Self::ApplyFailed(_) => "ApplyFailed",
            Self::WatchNotReady(_) => "WatchNotReady",
        }
    }

    pub fn message(&self) -> String {
        match self {
            Self::MalformedObject(error) => {
                format!("the object is not a valid AgentDeployment: {error}")
            }
            Self::InvalidSpec(violations) => format!(
                "{} validation error{}: {}",
                violations.len(),
                if violations.len() == 1 { "" } else { "s" },
                violations.join("; ")
            ),
            Self::ExternalSecretMissing(missing) => missing.join("; "),
            Self::ApplyFailed(error) | Self::WatchNotReady(error) => error.clone(),
        }
    }

    /// Whether the spec itself is at fault (nothing was applied).
    fn is_spec_error(&self) -> bool {
        matches!(self, Self::MalformedObject(_) | Self::InvalidSpec(_))
    }
}

/// The replica StatefulSet as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaObservation {
    /// The StatefulSet controller has seen the latest template.
    pub up_to_date: bool,
    pub replicas: i32,
    pub ready_replicas: i32,
    pub updated_replicas: i32,
    pub current_revision: Option<String>,
    pub update_revision: Option<String>,
}

/// One managed store (or the bucket Job) as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreObservation {
    pub name: String,
    pub ready: bool,
}

/// Everything the status is computed from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub generation: Option<i64>,
    pub desired_replicas: i32,
    /// Label selector of the replica pods (for the scale subresource).
    pub selector: Option<String>,
    pub problem: Option<Problem>,
    pub replicas: Option<ReplicaObservation>,
    /// Managed stores only; empty when every store is external.
    pub stores: Vec<StoreObservation>,
    /// The rollout's status, when the operator looked at the pods.
    pub rollout: Option<RolloutStatus>,
    /// Why the rollout stopped, when it did.
    pub stall: Option<Stall>,
    /// The revision every replica ran last (the StatefulSet's own
    /// `currentRevision` does not move under `OnDelete`).
    pub current_revision: Option<String>,
}

/// The new status. `previous` supplies the transition times of conditions
/// whose status did not change; `now` stamps the others.
pub fn compute(
    observed: &Observed,
    previous: Option<&AgentDeploymentStatus>,
    now: &Time,
) -> AgentDeploymentStatus {
    let previous_conditions = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let sts = observed.replicas.clone().unwrap_or_default();
    let desired = observed.desired_replicas;
    let mut conditions = Vec::new();
    let mut set = |type_: &str, status: bool, reason: &str, message: String| {
        conditions.push(condition(
            previous_conditions,
            observed.generation,
            now,
            type_,
            status,
            reason,
            message,
        ));
    };

    let unready_stores: Vec<&str> = observed
        .stores
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let stores_ready = unready_stores.is_empty();
    let current_revision = observed
        .current_revision
        .clone()
        .or_else(|| sts.current_revision.clone());
    let replicas_message = format!("{}/{desired} replicas ready", sts.ready_replicas);

    // Ready: the deployment serves turns as its spec asks.
    match &observed.problem {
        Some(problem) if problem.is_spec_error() => set(
            condition_types::READY,
            false,
            problem.reason(),
            problem.message(),
        ),
        Some(problem @ Problem::ExternalSecretMissing(_)) => set(
            condition_types::READY,
            false,
            problem.reason(),
            problem.message(),
        ),
        _ if !stores_ready => set(
            condition_types::READY,
            false,
            "StoresNotReady",
            format!("waiting for {}", unready_stores.join(", ")),
        ),
        _ if sts.ready_replicas < desired || observed.replicas.is_none() => set(
            condition_types::READY,
            false,
            "ReplicasNotReady",
            replicas_message.clone(),
        ),
        _ => set(
            condition_types::READY,
            true,
            "ReplicasReady",
            replicas_message.clone(),
        ),
    }

    // Progressing: the replicas are moving towards the spec.
    let progressing = match &observed.problem {
        Some(problem) if problem.is_spec_error() => Some((
            false,
            problem.reason(),
            "the spec must be fixed first".to_owned(),
        )),
        _ => None,
    }
    .or_else(|| {
        let rollout = observed.rollout.as_ref();
        if let Some(stall) = &observed.stall {
            Some((false, stall.reason, stall.message.clone()))
        } else if let Some(r) = rollout.filter(|r| r.phase == RolloutPhase::Paused) {
            Some((
                false,
                "RolloutPaused",
                r.message.clone().unwrap_or_else(|| "paused".into()),
            ))
        } else if observed.replicas.is_none() || !sts.up_to_date {
            Some((
                true,
                "Reconciling",
                "the replica StatefulSet is being updated".to_owned(),
            ))
        } else if sts.replicas != desired {
            Some((
                true,
                "Scaling",
                format!("scaling from {} to {desired} replicas", sts.replicas),
            ))
        } else if sts.update_revision != current_revision || sts.updated_replicas < sts.replicas {
            Some((
                true,
                "RevisionPending",
                format!(
                    "{}/{} replicas run revision {}",
                    sts.updated_replicas,
                    sts.replicas,
                    sts.update_revision.as_deref().unwrap_or("?")
                ),
            ))
        } else if sts.ready_replicas < desired {
            Some((true, "ReplicasStarting", replicas_message.clone()))
        } else {
            None
        }
    });
    match progressing {
        Some((status, reason, message)) => {
            set(condition_types::PROGRESSING, status, reason, message)
        }
        None => set(
            condition_types::PROGRESSING,
            false,
            "Complete",
            format!(
                "every replica runs revision {}",
                sts.update_revision.as_deref().unwrap_or("?")
            ),
        ),
    }

    // Degraded: something is wrong that a human should look at.
    match (&observed.problem, &observed.stall) {
        (Some(problem), _) => set(
            condition_types::DEGRADED,
            true,
            problem.reason(),
            problem.message(),
        ),
        (None, Some(stall)) => set(
            condition_types::DEGRADED,
            true,
            stall.reason,
            stall.message.clone(),
        ),
        (None, None) => set(
            condition_types::DEGRADED,
            false,
            "AsExpected",
            "no problem found".to_owned(),
        ),
    }

    if !observed.stores.is_empty() {
        if stores_ready {
            let names: Vec<&str> = observed.stores.iter().map(|s| s.name.as_str()).collect();
            set(
                condition_types::STORES_READY,
                true,
                "StoresReady",
                format!("{} ready", names.join(", ")),
            );
        } else {
            set(
                condition_types::STORES_READY,
                false,
                "StoresNotReady",
                format!("waiting for {}", unready_stores.join(", ")),
            );
        }
    }

    AgentDeploymentStatus {
        observed_generation: observed.generation,
        conditions,
        replicas: sts.replicas,
        ready_replicas: sts.ready_replicas,
        updated_replicas: sts.updated_replicas,
        current_revision,
        update_revision: sts.update_revision,
        rollout: observed
            .rollout
            .clone()
            .or_else(|| previous.and_then(|p| p.rollout.clone())),
        selector: observed.selector.clone(),
    }
}

/// The JSON merge patch (RFC 7386) from the `previous` status to `new`:
/// a field `new` no longer has is sent as `null`, or the API server would
/// keep it (and every later comparison would find a difference).
pub fn patch(
    previous: Option<&AgentDeploymentStatus>,
    new: &AgentDeploymentStatus,
) -> serde_json::Value {
    let new = serde_json::to_value(new).expect("a status serialises");
    let previous = previous
        .map(|p| serde_json::to_value(p).expect("a status serialises"))
        .unwrap_or(serde_json::Value::Null);
    serde_json::json!({ "status": merge_diff(&previous, new) })
}

fn merge_diff(previous: &serde_json::Value, new: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (previous, new) {
        (Value::Object(before), Value::Object(mut after)) => {
            for key in before.keys() {
                if !after.contains_key(key) {
                    after.insert(key.clone(), Value::Null);
                }
            }
            for (key, value) in after.iter_mut() {
                if let Some(old) = before.get(key) {
                    *value = merge_diff(old, std::mem::take(value));
                }
            }
            Value::Object(after)
        }
        (_, new) => new,
    }
}

fn condition(
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        // The API caps messages at 32768 bytes.
        message: truncate(message, 4096),
        observed_generation: generation,
        last_transition_time,
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The condition of `type_`, if present.
pub fn find<'a>(status: Option<&'a AgentDeploymentStatus>, type_: &str) -> Option<&'a Condition> {
    status?.conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    fn healthy() -> Observed {
        Observed {
            generation: Some(3),
            desired_replicas: 2,
            selector: Some("app=x".into()),
            problem: None,
            replicas: Some(ReplicaObservation {
                up_to_date: true,
                replicas: 2,
                ready_replicas: 2,
                updated_replicas: 2,
                current_revision: Some("bot-1".into()),
                update_revision: Some("bot-1".into()),
            }),
            stores: vec![StoreObservation {
                name: "redis".into(),
                ready: true,
            }],
            ..Observed::default()
        }
    }

    fn get<'a>(status: &'a AgentDeploymentStatus, type_: &str) -> &'a Condition {
        find(Some(status), type_).unwrap()
    }

    #[test]
    fn the_patch_removes_what_the_new_status_no_longer_has() {
        let previous = AgentDeploymentStatus {
            rollout: Some(RolloutStatus {
                message: Some("waiting".into()),
                pod: Some("bot-1".into()),
                ..RolloutStatus::default()
            }),
            current_revision: Some("bot-1".into()),
            ..AgentDeploymentStatus::default()
        };
        let new = AgentDeploymentStatus {
            rollout: Some(RolloutStatus {
                pod: Some("bot-0".into()),
                ..RolloutStatus::default()
            }),
            ..AgentDeploymentStatus::default()
        };
        let patch = patch(Some(&previous), &new);
        assert_eq!(
            patch["status"]["rollout"]["message"],
            serde_json::Value::Null
        );
        assert!(
            patch["status"]["rollout"]
                .as_object()
                .unwrap()
                .contains_key("message")
        );
        assert_eq!(patch["status"]["rollout"]["pod"], "bot-0");
        assert!(
            patch["status"]
                .as_object()
                .unwrap()
                .contains_key("currentRevision")
        );
        let fresh = super::patch(None, &new);
        assert!(
            !fresh["status"]["rollout"]
                .as_object()
                .unwrap()
                .contains_key("message")
        );
    }

    #[test]
    fn a_stalled_rollout_is_not_progressing_and_degraded() {
        let mut observed = healthy();
        observed.stall = Some(Stall {
            reason: crate::rollout::PROGRESS_DEADLINE_EXCEEDED,
            message: "pod bot-1 of revision bot-2 is not ready".into(),
        });
        let status = compute(&observed, None, &at(10));
        let progressing = get(&status, "Progressing");
        assert_eq!(progressing.status, "False");
        assert_eq!(progressing.reason, "ProgressDeadlineExceeded");
        let degraded = get(&status, "Degraded");
        assert_eq!(degraded.status, "True");
        assert!(degraded.message.contains("bot-1"));
    }

    #[test]
    fn the_rollout_says_which_revision_the_replicas_ran_under_on_delete() {
        let mut observed = healthy();
        observed.replicas.as_mut().unwrap().update_revision = Some("bot-2".into());
        observed.current_revision = Some("bot-0".into());
        let status = compute(&observed, None, &at(10));
        assert_eq!(status.current_revision.as_deref(), Some("bot-0"));
        assert_eq!(get(&status, "Progressing").reason, "RevisionPending");
    }

    #[test]
    fn a_healthy_deployment_is_ready_and_not_progressing() {
        let status = compute(&healthy(), None, &at(10));
        assert_eq!(get(&status, "Ready").status, "True");
        assert_eq!(get(&status, "Progressing").status, "False");
        assert_eq!(get(&status, "Degraded").status, "False");
        assert_eq!(get(&status, "StoresReady").status, "True");
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.ready_replicas, 2);
    }

    #[test]
    fn transition_times_move_only_when_a_status_changes() {
        let first = compute(&healthy(), None, &at(10));
        let same = compute(&healthy(), Some(&first), &at(20));
        assert_eq!(first, same, "nothing changed, so nothing to write");
        let mut degraded = healthy();
        degraded.replicas.as_mut().unwrap().ready_replicas = 1;
        let later = compute(&degraded, Some(&same), &at(30));
        assert_eq!(get(&later, "Ready").last_transition_time, at(30));
        assert_eq!(get(&later, "Degraded").last_transition_time, at(10));
    }

    #[test]
    fn an_invalid_spec_names_every_violation() {
        let mut observed = healthy();
        observed.problem = Some(Problem::InvalidSpec(vec![
            "spec.podLabels: reserved".into(),
            "spec.env[0].name: reserved".into(),
        ]));
        let status = compute(&observed, None, &at(1));
        let ready = get(&status, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert!(
            ready
                .message
                .contains("2 validation errors: spec.podLabels: reserved; spec.env[0].name")
        );
        assert_eq!(get(&status, "Degraded").status, "True");
        assert_eq!(get(&status, "Progressing").status, "False");
    }

    #[test]
    fn a_new_revision_is_progressing() {
        let mut observed = healthy();
        let sts = observed.replicas.as_mut().unwrap();
        sts.update_revision = Some("bot-2".into());
        sts.updated_replicas = 0;
        let status = compute(&observed, None, &at(1));
        let progressing = get(&status, "Progressing");
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("True", "RevisionPending")
        );
        assert_eq!(status.update_revision.as_deref(), Some("bot-2"));
    }

    #[test]
    fn unready_stores_hold_readiness_back_and_stores_ready_is_absent_without_managed_stores() {
        let mut observed = healthy();
        observed.stores[0].ready = false;
        let status = compute(&observed, None, &at(1));
        assert_eq!(get(&status, "Ready").reason, "StoresNotReady");
        observed.stores.clear();
        let status = compute(&observed, None, &at(1));
        assert!(find(Some(&status), "StoresReady").is_none());
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let cut = truncate("é".repeat(5000), 4097);
        assert!(cut.len() <= 4100 && cut.ends_with('…'));
    }
}
