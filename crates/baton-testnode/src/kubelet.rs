//! The node's sync loop. Watches pods, services and claims (reflector
//! stores) and, on every change and at least once a second: binds
//! unscheduled pods, provisions volumes for pending claims, starts a worker
//! for each pod bound here, hands each worker its pod's latest object,
//! completes deletions of pods it is not running, and refreshes the pods'
//! hosts files.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::node::NodeCtx;
use crate::runtime::pod;
use crate::runtime::state::PodShared;

/// A pod this node runs.
pub(crate) struct PodEntry {
    pub namespace: String,
    pub name: String,
    pub shared: Arc<PodShared>,
    pub updates: watch::Sender<Arc<Pod>>,
    pub task: JoinHandle<()>,
}

pub(crate) type PodTable = Arc<Mutex<HashMap<String, PodEntry>>>;

/// Feeds a reflector store from a watch of every `K` in the cluster and
/// pokes `changed` on each event. Watch errors are retried with the
/// watcher's default back-off.
pub(crate) fn reflect<K>(
    client: kube::Client,
    writer: Writer<K>,
    changed: Arc<Notify>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client);
    tokio::spawn(async move {
        watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(|event| {
                if let Err(e) = event {
                    tracing::debug!("watch error (retrying): {e}");
                }
                changed.notify_one();
                futures::future::ready(())
            })
            .await;
    })
}

/// The sync loop's memory between rounds.
#[derive(Default)]
struct Memory {
    /// Pods (uid) whose binding failed: not before this instant again.
    bind_backoff: HashMap<String, (Instant, Duration)>,
    /// Claims (uid) a volume was created for.
    provisioned: HashSet<String>,
    /// Pods (uid) whose worker ended or whose deletion is being completed:
    /// never started again.
    finished: HashSet<String>,
}

pub(crate) async fn sync_loop(
    node: Arc<NodeCtx>,
    pods: PodTable,
    claims: Store<PersistentVolumeClaim>,
    changed: Arc<Notify>,
) {
    let mut memory = Memory::default();
    let mut shutdown = node.shutdown_signal();
    loop {
        sync_once(&node, &pods, &claims, &mut memory).await;
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        // Let a burst of events land before the next round.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn sync_once(
    node: &Arc<NodeCtx>,
    table: &PodTable,
    claims: &Store<PersistentVolumeClaim>,
    memory: &mut Memory,
) {
    let all_pods = node.pods.state();
    let now = Instant::now();

    // Scheduling.
    for pod in all_pods.iter().filter(|p| crate::scheduler::wants_node(p)) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if memory.bind_backoff.get(&uid).is_some_and(|(t, _)| *t > now) {
            continue;
        }
        match crate::scheduler::bind(&node.client, pod, node.name()).await {
            Ok(()) => {
                memory.bind_backoff.remove(&uid);
                tracing::debug!(pod = ?pod.metadata.name, "bound");
            }
            Err(e) => {
                let delay = memory
                    .bind_backoff
                    .get(&uid)
                    .map_or(Duration::from_millis(200), |(_, d)| {
                        (*d * 2).min(Duration::from_secs(5))
                    });
                memory.bind_backoff.insert(uid, (now + delay, delay));
                tracing::debug!(pod = ?pod.metadata.name, "binding failed: {e}");
            }
        }
    }

    let live_pods: HashSet<&str> = all_pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    memory
        .bind_backoff
        .retain(|uid, _| live_pods.contains(uid.as_str()));

    // Volumes.
    for pvc in claims
        .state()
        .iter()
        .filter(|c| crate::storage::needs_volume(c))
    {
        let uid = pvc.metadata.uid.clone().unwrap_or_default();
        if memory.provisioned.contains(&uid) {
            continue;
        }
        match crate::storage::provision(&node.client, node.name(), &node.config.work_dir, pvc).await
        {
            Ok(()) => {
                memory.provisioned.insert(uid);
            }
            Err(e) => tracing::warn!(claim = ?pvc.metadata.name, "provisioning a volume: {e:#}"),
        }
    }
    let live_claims: HashSet<String> = claims
        .state()
        .iter()
        .filter_map(|c| c.metadata.uid.clone())
        .collect();
    memory.provisioned.retain(|uid| live_claims.contains(uid));

    // Pods bound here.
    let mine: HashMap<String, Arc<Pod>> = all_pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.name()))
        .filter_map(|p| Some((p.metadata.uid.clone()?, p.clone())))
        .collect();
    let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
    table.retain(|uid, entry| {
        if entry.task.is_finished() {
            memory.finished.insert(uid.clone());
            return false;
        }
        // Dropping the sender tells the worker its pod is gone.
        mine.contains_key(uid)
    });
    memory.finished.retain(|uid| mine.contains_key(uid));
    if node.is_shutting_down() {
        return;
    }
    for (uid, pod) in &mine {
        if let Some(entry) = table.get(uid) {
            entry.updates.send_if_modified(|current| {
                let newer = current.metadata.resource_version != pod.metadata.resource_version;
                if newer {
                    *current = pod.clone();
                }
                newer
            });
            continue;
        }
        if memory.finished.contains(uid) {
            continue;
        }
        let terminal = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if pod.metadata.deletion_timestamp.is_some() {
            // Deleted while this node was not running it (stopped, say):
            // nothing to stop, finish the deletion.
            memory.finished.insert(uid.clone());
            tokio::spawn(pod::finish_deletion(node.clone(), pod.clone()));
            continue;
        }
        if terminal {
            continue;
        }
        tracing::info!(pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()), "starting pod");
        let shared = Arc::new(PodShared::new(pod::initial_state(pod)));
        let (updates, rx) = watch::channel(pod.clone());
        let task = tokio::spawn(pod::run(node.clone(), rx, shared.clone()));
        table.insert(
            uid.clone(),
            PodEntry {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                shared,
                updates,
                task,
            },
        );
    }

    // Service names.
    for (uid, entry) in table.iter() {
        let Some(pod) = mine.get(uid) else { continue };
        let (netns, ip, up) = entry
            .shared
            .read(|s| (s.netns.clone(), s.ip, s.sandbox_ready));
        if let (Some(netns), Some(ip), true) = (netns, ip, up) {
            node.dns_write_at(pod, &netns, ip);
        }
    }
}
