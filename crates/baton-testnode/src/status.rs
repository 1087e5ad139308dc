//! The pod status a kubelet reports, computed from the node's view of the
//! pod's sandbox and containers: phase, conditions (with their transition
//! times carried over while unchanged), IPs, start time and container
//! statuses.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    ContainerState as K8sContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::runtime::state::{ContainerState, Current, PodState, Termination};

/// Whether every init container has completed successfully.
fn initialized(state: &PodState) -> bool {
    state
        .init_containers
        .iter()
        .all(|c| c.done && matches!(&c.current, Current::Terminated(t) if t.exit_code == 0))
}

/// The phase that the containers' states give.
pub(crate) fn phase(state: &PodState) -> &'static str {
    let init_failed = state
        .init_containers
        .iter()
        .any(|c| c.done && !matches!(&c.current, Current::Terminated(t) if t.exit_code == 0));
    if init_failed {
        return "Failed";
    }
    if !initialized(state) {
        return "Pending";
    }
    let containers = &state.containers;
    if !containers.is_empty() && containers.iter().all(|c| c.done) {
        let all_zero = containers
            .iter()
            .all(|c| matches!(&c.current, Current::Terminated(t) if t.exit_code == 0));
        return if all_zero { "Succeeded" } else { "Failed" };
    }
    let never_started = |c: &ContainerState| {
        matches!(c.current, Current::Waiting { .. }) && c.last.is_none() && c.restart_count == 0
    };
    if containers.is_empty() || containers.iter().any(never_started) {
        "Pending"
    } else {
        "Running"
    }
}

/// The status to write for `pod`. `previous` is the last status written
/// (or read), whose condition transition times are kept while a condition
/// does not change.
pub(crate) fn pod_status(
    pod: &Pod,
    state: &PodState,
    host_ip: Ipv4Addr,
    previous: Option<&PodStatus>,
) -> PodStatus {
    let phase = phase(state);
    let now = Time(Timestamp::now());
    let unready: Vec<&str> = state
        .containers
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let all_ready = unready.is_empty() && !state.containers.is_empty();
    let (ready_reason, ready_message) = if all_ready {
        (None, None)
    } else if matches!(phase, "Succeeded" | "Failed") {
        (Some("PodCompleted"), None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let condition = |type_: &str, ok: bool, reason: Option<&str>, message: Option<String>| {
        let status = if ok { "True" } else { "False" };
        let since = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(since),
            reason: reason.map(str::to_owned),
            message,
            ..PodCondition::default()
        }
    };
    let conditions = vec![
        condition("PodReadyToStartContainers", state.sandbox_ready, None, None),
        condition(
            "Initialized",
            initialized(state),
            (!initialized(state)).then_some("ContainersNotInitialized"),
            None,
        ),
        condition("Ready", all_ready, ready_reason, ready_message.clone()),
        condition("ContainersReady", all_ready, ready_reason, ready_message),
        condition("PodScheduled", true, None, None),
    ];
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: Some(host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: host_ip.to_string(),
        }]),
        pod_ip: state.ip.map(|ip| ip.to_string()),
        pod_ips: state.ip.map(|ip| vec![PodIP { ip: ip.to_string() }]),
        start_time: state.start_time.map(Time),
        observed_generation: pod.metadata.generation,
        qos_class: pod.status.as_ref().and_then(|s| s.qos_class.clone()),
        init_container_statuses: (!state.init_containers.is_empty())
            .then(|| state.init_containers.iter().map(container_status).collect()),
        container_statuses: Some(state.containers.iter().map(container_status).collect()),
        ..PodStatus::default()
    }
}

fn container_status(c: &ContainerState) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: c.image_id.clone(),
        container_id: c.container_id.clone(),
        ready: c.ready,
        started: Some(c.started),
        restart_count: c.restart_count,
        state: Some(container_state(&c.current)),
        last_state: Some(
            c.last
                .as_ref()
                .map(|t| container_state(&Current::Terminated(t.clone())))
                .unwrap_or_default(),
        ),
        ..ContainerStatus::default()
    }
}

fn container_state(current: &Current) -> K8sContainerState {
    match current {
        Current::Waiting { reason, message } => K8sContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..K8sContainerState::default()
        },
        Current::Running { started_at } => K8sContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(*started_at)),
            }),
            ..K8sContainerState::default()
        },
        Current::Terminated(t) => K8sContainerState {
            terminated: Some(terminated(t)),
            ..K8sContainerState::default()
        },
    }
}

fn terminated(t: &Termination) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(t.reason.clone()),
        message: t.message.clone(),
        started_at: t.started_at.map(Time),
        finished_at: Some(Time(t.finished_at)),
        container_id: t.container_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(current: Current, done: bool) -> ContainerState {
        ContainerState {
            current,
            done,
            ..ContainerState::new("c", "redis")
        }
    }

    fn exited(code: i32) -> Current {
        Current::Terminated(Termination {
            exit_code: code,
            signal: None,
            reason: "Completed".into(),
            message: None,
            started_at: None,
            finished_at: Timestamp::now(),
            container_id: None,
        })
    }

    #[test]
    fn phases() {
        let state = |cs: Vec<ContainerState>| PodState {
            containers: cs,
            ..PodState::default()
        };
        let running = Current::Running {
            started_at: Timestamp::now(),
        };
        assert_eq!(
            phase(&state(vec![ContainerState::new("c", "x")])),
            "Pending"
        );
        assert_eq!(
            phase(&state(vec![container(running.clone(), false)])),
            "Running"
        );
        assert_eq!(
            phase(&state(vec![
                container(exited(0), true),
                container(exited(0), true)
            ])),
            "Succeeded"
        );
        assert_eq!(
            phase(&state(vec![
                container(exited(0), true),
                container(exited(1), true)
            ])),
            "Failed"
        );
        assert_eq!(
            phase(&state(vec![
                container(exited(0), true),
                container(running, false)
            ])),
            "Running"
        );
    }

    #[test]
    fn transition_times_survive_while_a_condition_holds() {
        let pod = Pod::default();
        let mut state = PodState {
            containers: vec![container(
                Current::Running {
                    started_at: Timestamp::now(),
                },
                false,
            )],
            sandbox_ready: true,
            ..PodState::default()
        };
        let host = Ipv4Addr::new(10, 244, 1, 1);
        let mut first = pod_status(&pod, &state, host, None);
        let old = Time(Timestamp::UNIX_EPOCH);
        for c in first.conditions.as_mut().unwrap() {
            c.last_transition_time = Some(old.clone());
        }
        let ready_time = |s: &PodStatus| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "Ready")
                .unwrap()
                .last_transition_time
                .clone()
        };
        let same = pod_status(&pod, &state, host, Some(&first));
        assert_eq!(ready_time(&same), Some(old.clone()));
        state.containers[0].ready = true;
        let changed = pod_status(&pod, &state, host, Some(&first));
        assert_ne!(ready_time(&changed), Some(old));
    }
}
