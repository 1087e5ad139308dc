//! One pod's life on the node: sandbox (network namespace), volumes,
//! containers, status, and the kubelet's side of deletion (stop the
//! containers within the grace period, then delete the pod object with
//! grace period 0, which is what completes the deletion of a bound pod).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::container::{ContainerTask, Stop};
use super::state::{ContainerState, PodShared, PodState, Slot};
use crate::network::Sandbox;
use crate::node::NodeCtx;
use crate::volumes::PodDirs;

/// Why a pod's worker stops its containers.
enum End {
    /// The pod has a deletionTimestamp: graceful, then DELETE.
    Deleted,
    /// The pod object is gone (deleted with grace 0) or the node stops:
    /// kill at once, no API calls.
    Gone,
}

pub(crate) fn initial_state(pod: &Pod) -> PodState {
    let spec = pod.spec.clone().unwrap_or_default();
    let states = |list: &[k8s_openapi::api::core::v1::Container]| -> Vec<ContainerState> {
        list.iter()
            .map(|c| ContainerState::new(&c.name, c.image.as_deref().unwrap_or_default()))
            .collect()
    };
    let init_containers = states(spec.init_containers.as_deref().unwrap_or_default());
    let mut containers = states(&spec.containers);
    if !init_containers.is_empty() {
        for c in &mut containers {
            c.current = super::state::Current::Waiting {
                reason: "PodInitializing".into(),
                message: None,
            };
        }
    }
    PodState {
        init_containers,
        containers,
        ..PodState::default()
    }
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Runs the pod until its deletion is complete (or the node stops).
/// `updates` carries the latest pod object; it closes when the pod is gone
/// from the API.
pub(crate) async fn run(
    node: Arc<NodeCtx>,
    mut updates: watch::Receiver<Arc<Pod>>,
    shared: Arc<PodShared>,
) {
    let pod = updates.borrow().clone();
    let key = key(&pod);
    let (finish_tx, finish_rx) = watch::channel(false);
    let writer = tokio::spawn(status_writer(
        node.clone(),
        updates.clone(),
        shared.clone(),
        finish_rx,
    ));
    let end = match start(&node, &pod, &shared, &mut updates).await {
        Ok((sandbox, mut containers, stop_tx)) => {
            let (end, sandbox_up) =
                wait_for_end(&node, &mut updates, &mut containers, &shared, &sandbox).await;
            let latest = updates.borrow().clone();
            let stop = match end {
                End::Deleted => {
                    let grace = latest
                        .metadata
                        .deletion_grace_period_seconds
                        .or(latest
                            .spec
                            .as_ref()
                            .and_then(|s| s.termination_grace_period_seconds))
                        .unwrap_or(30)
                        .max(0) as u64;
                    tracing::info!(pod = %key, grace, "stopping the pod's containers");
                    Stop {
                        deadline: Instant::now() + Duration::from_secs(grace),
                        graceful: grace > 0,
                    }
                }
                End::Gone => Stop {
                    deadline: Instant::now(),
                    graceful: false,
                },
            };
            let _ = stop_tx.send(Some(stop));
            while containers.join_next().await.is_some() {}
            if sandbox_up {
                shared.update(|s| s.sandbox_ready = false);
                node.dns_forget(&sandbox.netns);
                node.net.destroy_sandbox(&sandbox).await;
            }
            end
        }
        Err(end) => end,
    };
    // The final status (containers terminated) before the object goes.
    let _ = finish_tx.send(true);
    let _ = writer.await;
    if matches!(end, End::Deleted) && !node.is_shutting_down() {
        delete_for_good(&node, &pod).await;
    }
    let dirs = dirs(&node, &pod);
    let _ = tokio::fs::remove_dir_all(&dirs.incarnation).await;
    tracing::debug!(pod = %key, "pod worker done");
}

fn dirs(node: &NodeCtx, pod: &Pod) -> PodDirs {
    PodDirs::new(
        &node.config.work_dir,
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
    )
}

/// What ends the wait before the containers ran: deletion or disappearance.
fn end_of(updates: &watch::Receiver<Arc<Pod>>, node: &NodeCtx) -> Option<End> {
    if node.is_shutting_down() || updates.has_changed().is_err() {
        Some(End::Gone)
    } else if updates.borrow().metadata.deletion_timestamp.is_some() {
        Some(End::Deleted)
    } else {
        None
    }
}

/// Sandbox, volumes, container tasks. Retries until they are up or the
/// pod ends.
async fn start(
    node: &Arc<NodeCtx>,
    pod: &Arc<Pod>,
    shared: &Arc<PodShared>,
    updates: &mut watch::Receiver<Arc<Pod>>,
) -> Result<(Sandbox, JoinSet<()>, watch::Sender<Option<Stop>>), End> {
    let key = key(pod);
    let sandbox = loop {
        if let Some(end) = end_of(updates, node) {
            return Err(end);
        }
        match node.net.create_sandbox().await {
            Ok(sandbox) => break sandbox,
            Err(e) => {
                tracing::warn!(pod = %key, "creating the pod's network namespace: {e:#}");
                set_all_waiting(shared, "ContainerCreating", Some(format!("{e:#}")));
                wait_a_moment(updates, Duration::from_secs(1)).await;
            }
        }
    };
    shared.update(|s| {
        s.ip = Some(sandbox.ip);
        s.netns = Some(sandbox.netns.clone());
        s.start_time = Some(Timestamp::now());
        s.sandbox_ready = true;
    });
    // Service names must resolve from the first lookup on.
    node.dns_write(pod, &sandbox);
    let dirs = dirs(node, pod);
    let volumes = loop {
        if let Some(end) = end_of(updates, node) {
            node.dns_forget(&sandbox.netns);
            node.net.destroy_sandbox(&sandbox).await;
            return Err(end);
        }
        match crate::volumes::prepare(&node.client, pod, &dirs).await {
            Ok(volumes) => break volumes,
            Err(message) => {
                tracing::debug!(pod = %key, "volumes not ready: {message}");
                set_all_waiting(shared, "ContainerCreating", Some(message));
                wait_a_moment(updates, Duration::from_millis(500)).await;
            }
        }
    };
    let volumes: Arc<HashMap<_, _>> = Arc::new(volumes);
    let (stop_tx, stop_rx) = watch::channel(None);
    let task = |slot: Slot, spec: Container| ContainerTask {
        node: node.clone(),
        pod: pod.clone(),
        shared: shared.clone(),
        slot,
        spec,
        sandbox: sandbox.clone(),
        dirs: dirs.clone(),
        volumes: volumes.clone(),
        stop: stop_rx.clone(),
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let inits: Vec<ContainerTask> = spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, c)| task(Slot { init: true, index }, c))
        .collect();
    let mains: Vec<ContainerTask> = spec
        .containers
        .into_iter()
        .enumerate()
        .map(|(index, c)| task(Slot { init: false, index }, c))
        .collect();
    let mut containers = JoinSet::new();
    containers.spawn(run_containers(shared.clone(), inits, mains));
    Ok((sandbox, containers, stop_tx))
}

/// Init containers one after the other, each to its successful end, then
/// the regular containers side by side. Returns when every container has
/// finished for good (or the pod stopped them).
async fn run_containers(
    shared: Arc<PodShared>,
    inits: Vec<ContainerTask>,
    mains: Vec<ContainerTask>,
) {
    for init in inits {
        let slot = init.slot;
        let stop = init.stop.clone();
        init.run().await;
        let state = shared.container(slot);
        let succeeded =
            matches!(&state.current, super::state::Current::Terminated(t) if t.exit_code == 0);
        if !succeeded || stop.borrow().is_some() {
            // Failed for good (restartPolicy Never) or stopped: the regular
            // containers never start.
            for main in &mains {
                shared.update_container(main.slot, |c| c.done = true);
            }
            return;
        }
    }
    let mut set = JoinSet::new();
    for main in mains {
        set.spawn(main.run());
    }
    while set.join_next().await.is_some() {}
}

fn set_all_waiting(shared: &PodShared, reason: &str, message: Option<String>) {
    shared.update(|s| {
        for c in s.init_containers.iter_mut().chain(&mut s.containers) {
            c.current = super::state::Current::Waiting {
                reason: reason.into(),
                message: message.clone(),
            };
        }
    });
}

/// Waits `d` or until the pod object changes.
async fn wait_a_moment(updates: &mut watch::Receiver<Arc<Pod>>, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = updates.changed() => {}
    }
}

/// Waits for the pod's deletion or disappearance. Once every container has
/// finished for good (a completed Job pod), the sandbox is torn down early
/// and its address freed, as a kubelet does for terminal pods. Returns
/// whether the sandbox is still up.
async fn wait_for_end(
    node: &Arc<NodeCtx>,
    updates: &mut watch::Receiver<Arc<Pod>>,
    containers: &mut JoinSet<()>,
    shared: &PodShared,
    sandbox: &Sandbox,
) -> (End, bool) {
    let mut sandbox_up = true;
    let mut shutdown = node.shutdown_signal();
    loop {
        if let Some(end) = end_of(updates, node) {
            return (end, sandbox_up);
        }
        tokio::select! {
            changed = updates.changed() => {
                if changed.is_err() {
                    return (End::Gone, sandbox_up);
                }
            }
            stopping = shutdown.wait_for(|s| *s) => {
                drop(stopping);
                return (End::Gone, sandbox_up);
            }
            Some(_) = containers.join_next(), if !containers.is_empty() => {}
        }
        if containers.is_empty() && sandbox_up {
            sandbox_up = false;
            shared.update(|s| s.sandbox_ready = false);
            node.dns_forget(&sandbox.netns);
            node.net.destroy_sandbox(sandbox).await;
        }
    }
}

/// Writes the pod's status whenever the node's view of it changes (and
/// only then), until told to finish; the last write happens after that.
async fn status_writer(
    node: Arc<NodeCtx>,
    updates: watch::Receiver<Arc<Pod>>,
    shared: Arc<PodShared>,
    mut finish: watch::Receiver<bool>,
) {
    let mut previous: Option<PodStatus> = updates.borrow().status.clone();
    let mut written: Option<serde_json::Value> = None;
    let mut failures = 0u32;
    loop {
        let finishing = *finish.borrow();
        let pod = updates.borrow().clone();
        let state = shared.snapshot();
        let status = crate::status::pod_status(&pod, &state, node.net.host_ip(), previous.as_ref());
        let value = serde_json::to_value(&status).unwrap_or_default();
        let mut ok = true;
        let pod_exists = updates.has_changed().is_ok();
        if written.as_ref() != Some(&value) && pod_exists && !node.is_shutting_down() {
            match patch_status(&node, &pod, &value).await {
                Ok(()) => {
                    written = Some(value);
                    previous = Some(status);
                    failures = 0;
                }
                Err(e) if is_not_found(&e) => return,
                Err(e) => {
                    ok = false;
                    failures += 1;
                    tracing::debug!(pod = %key(&pod), "writing the pod status: {e}");
                }
            }
        }
        if finishing && (ok || failures > 10 || node.is_shutting_down()) {
            return;
        }
        let retry = if ok {
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(200 * u64::from(failures.min(10)))
        };
        tokio::select! {
            _ = shared.changed.notified() => {}
            _ = finish.changed(), if !finishing => {}
            _ = tokio::time::sleep(retry) => {}
        }
        // Coalesce bursts (a container start touches the state twice).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn patch_status(node: &NodeCtx, pod: &Pod, status: &serde_json::Value) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(
        node.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = serde_json::json!({
        "metadata": {"uid": pod.metadata.uid},
        "status": status,
    });
    api.patch_status(
        pod.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// DELETE with grace period 0 (and the pod's uid as precondition, so a
/// re-created pod of the same name is left alone), retried with back-off.
async fn delete_for_good(node: &NodeCtx, pod: &Pod) {
    let api: Api<Pod> = Api::namespaced(
        node.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let mut delay = Duration::from_millis(100);
    loop {
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %key(pod), "pod deleted");
                return;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
            Err(e) => {
                if node.is_shutting_down() {
                    return;
                }
                tracing::warn!(pod = %key(pod), "deleting the pod: {e}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// For pods this node never ran (deleted while it was stopped, or already
/// terminal): complete their deletion.
pub(crate) async fn finish_deletion(node: Arc<NodeCtx>, pod: Arc<Pod>) {
    delete_for_good(&node, &pod).await;
}
