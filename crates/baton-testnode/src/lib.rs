//! A kubelet stand-in for tests: a [`TestNode`] registers a Node with a real
//! control plane (kube-apiserver and kube-controller-manager, no scheduler,
//! no kubelet, see `baton_testkit::kube`), binds every pending pod to
//! itself and runs the pods' containers as local processes, with a fixed
//! table of images instead of a registry.
//!
//! What it does, as a kubelet (and a scheduler, and a volume provisioner)
//! would:
//!
//! - **Node.** Registers a Ready Node (64 cpu, 256Gi memory, 500 pods) and
//!   renews its Lease in `kube-node-lease` and its conditions' heartbeat
//!   every 10 s, so the node-lifecycle controller never taints it.
//! - **Scheduling.** Binds every unscheduled pod of the default scheduler
//!   to itself (the `binding` subresource). For a Pending
//!   PersistentVolumeClaim it creates a hostPath PersistentVolume (a
//!   directory under `work_dir/volumes/`, reclaim policy Retain) with a
//!   `claimRef`; the controller-manager binds the claim. A pod's claim
//!   volume is that directory, so data outlives pod deletion.
//! - **Images.** [`ImageTable`] maps image repositories (tag and digest
//!   ignored) to [`Runner`]s: Baton's image runs the `baton` binary,
//!   the example agent images run `baton agent`, `redis` runs
//!   `redis-server`, `postgres` does what the official image's entrypoint
//!   does (initdb as the `postgres` user, then `postgres` on port 5432),
//!   `minio/minio` runs SeaweedFS `weed mini` serving S3 on the MinIO port
//!   with MINIO_ROOT_USER / MINIO_ROOT_PASSWORD as its keys, `minio/mc`
//!   (the bucket Job) creates `$BATON_S3_BUCKET` with one signed `curl`
//!   PUT. SeaweedFS's gRPC ports come from the pod IP: it also serves them
//!   on Unix sockets at fixed paths in `/tmp`, which pods share. An image not in the table leaves its container Waiting with
//!   reason `ErrImagePull`, as a failing pull would.
//! - **The one mock.** MinIO's probe paths (`/minio/health/live`,
//!   `/minio/health/ready`, …) do not exist in SeaweedFS: for the MinIO
//!   image they are asked of SeaweedFS's S3 `/healthz` instead. Everything
//!   else a probe or hook does is real.
//! - **Containers.** Environment from `value`, `envFrom`,
//!   `secretKeyRef` / `configMapKeyRef` (with `optional`) and `fieldRef`
//!   (metadata.name/namespace/uid/labels/annotations, spec.nodeName,
//!   spec.serviceAccountName, status.podIP, status.hostIP); `$(VAR)`
//!   expansion in env values, command and args. No service-link variables
//!   (but the API server's, see below), no `resourceFieldRef`. Nothing of the test process's environment leaks
//!   in: a process gets PATH, HOME (its working directory), HOSTNAME,
//!   TMPDIR and its container's variables. Processes run as root, except
//!   Postgres; securityContext is ignored.
//! - **Paths.** A process sees the host's filesystem, not the container's.
//!   So any env value or arg that is a path equal to or under one of the
//!   container's volumeMount paths (also the value of a `--flag=/path`
//!   arg) is rewritten to the host directory of that volume (plus
//!   subPath). Store data directories outside every mount (Redis `--dir`,
//!   PGDATA, MinIO's data dir) go to a stand-in root under the container's
//!   directory, never to the host's own `/data`. Each container's working
//!   directory is `work_dir/pods/<ns>_<pod>/<uid>/containers/<name>`; its
//!   stdout and stderr are appended to `work_dir/pods/<ns>_<pod>/<name>.log`
//!   (see [`TestNode::log_path`]), with the node's own lines (exec, exit,
//!   probe kills) marked `[testnode …]`.
//! - **Volumes.** emptyDir (a directory per pod incarnation, removed with
//!   the pod), persistentVolumeClaim, hostPath, configMap and secret (keys
//!   written once at start), projected (configMap, secret, downwardAPI
//!   fieldRefs, serviceAccountToken: a real token bound to the pod, not
//!   refreshed). Other types get an empty directory.
//! - **Probes.** httpGet and tcpSocket from the node to the pod IP, exec
//!   inside the pod's network namespace, for startup, readiness and
//!   liveness probes with their thresholds and timeouts. Periods are capped
//!   at [`NodeConfig::probe_period_cap`] (1 s by default) to keep tests
//!   fast; initial delays are kept. Readiness drives the container's
//!   `ready` and the pod's Ready / ContainersReady conditions; a failed
//!   liveness or startup probe restarts the container.
//! - **Restarts.** A container that exits is restarted per the pod's
//!   restartPolicy (Always; OnFailure when it failed; Never), with
//!   restartCount and lastState, after a back-off of 250 ms doubling up to
//!   [`NodeConfig::max_restart_backoff`] (4 s). A pod whose containers all
//!   exited 0 and will not restart (a Job's) is Succeeded.
//! - **Status.** Through the `status` subresource, only when it changed:
//!   phase, conditions (PodReadyToStartContainers, Initialized, Ready,
//!   ContainersReady, PodScheduled, with lastTransitionTime), podIP(s),
//!   hostIP(s), startTime, containerStatuses (state, lastState, ready,
//!   started, restartCount, containerID, imageID).
//! - **Deletion.** When a pod gets a deletionTimestamp, each container's
//!   preStop hook (httpGet, exec, tcpSocket or sleep) runs, then SIGTERM,
//!   then SIGKILL to its process group at the end of the pod's deletion
//!   grace period; then the node deletes the pod with grace period 0,
//!   which is what completes the deletion of a bound pod. A pod deleted
//!   while no node ran it is simply deleted. [`TestNode::stop`] and `Drop`
//!   kill every process of the node.
//! - **Networking.** Each pod gets its own network namespace (iproute2,
//!   needs root), rather than a loopback address per pod: every pod has its
//!   own `127.0.0.1`, so a sidecar reaches its agent at `127.0.0.1:8080`
//!   and two pods can both listen on port 8080. A veth pair joins the
//!   namespace to a per-node Linux bridge; pod IPs come from
//!   `10.244.N.0/24`, N unique among the nodes running on the machine, also
//!   across test processes. The test process (root namespace) reaches pods
//!   at their IP ([`TestNode::pod_ip`]); pods reach each other and the node
//!   (10.244.N.1), not the machine's loopback. Processes start with
//!   `ip netns exec`, which bind-mounts `/etc/netns/<ns>/hosts` over
//!   `/etc/hosts`; that file is how Service names resolve: every Service
//!   with a selector resolves to a ready pod it selects (any selected pod
//!   when none is ready), headless Services also give each pod's
//!   `pod.svc.ns.svc.cluster.local` name. There are no virtual IPs: a
//!   Service name reaches the pod's targetPort, and a Service whose port
//!   differs from its targetPort must be addressed on the targetPort. The
//!   files are rewritten in place (the bind mount pins the inode; glibc
//!   rereads /etc/hosts on every lookup). Other names fail at once
//!   (resolv.conf points at the pod's own loopback). Namespaces, veths,
//!   the bridge and `/etc/netns` entries are removed on stop, on drop, and
//!   by a watcher process when the test process dies. Pods of two nodes
//!   cannot reach each other (no IP forwarding is switched on).
//! - **Robustness.** No task panics on API errors: watches back off and
//!   retry, status writes and deletions are retried, bindings are retried
//!   with back-off. Logs go through `tracing`.
//!
//! - **Init containers** run one after the other to success (retried on
//!   failure unless the pod's restartPolicy is Never, which fails the pod)
//!   before the regular containers start; the Initialized condition and
//!   initContainerStatuses follow.
//!
//! Not done: native sidecars (init containers with restartPolicy Always),
//! ephemeral containers, postStart hooks, resource limits, hostNetwork,
//! image updates of a running pod, HTTPS and gRPC probes, the kubelet's own
//! API (`kubectl logs` / `exec`: read [`TestNode::log_path`] and use
//! `ip netns exec` with [`TestNode::netns_of`] instead), Service virtual IPs
//! (a test that needs a Service's load spreading starts a [`ServiceProxy`],
//! kube-proxy's part in user space, on a local port).
//!
//! - **The API server** ([`NodeConfig::api_server`], off by default): a
//!   TCP relay on the node's bridge address forwards to the API server on
//!   the machine's loopback; pods' hosts files resolve
//!   `kubernetes.default.svc` (the name the server's certificate carries)
//!   to it, containers get `KUBERNETES_SERVICE_HOST=kubernetes.default.svc`
//!   and `KUBERNETES_SERVICE_PORT` (a kubelet gives the Service's cluster
//!   IP, which does not exist here), and the projected service-account
//!   volume gets a real bound token (TokenRequest), `ca.crt` from the
//!   `kube-root-ca.crt` ConfigMap and the namespace. Mounts under
//!   `/var/run/secrets/` are bind-mounted for real in the process's own
//!   mount namespace, since clients open them without being told the path.
//!   So an operator or dashboard runs in a pod with its in-cluster
//!   configuration and exactly its ServiceAccount's rights.
//!
//! The node's tasks run on the Tokio runtime that calls
//! [`TestNode::start`]; keep that runtime alive as long as the node.
#![forbid(unsafe_code)]

mod api_proxy;
mod config;
mod dns;
mod env;
mod images;
mod kubelet;
mod network;
mod node;
mod paths;
mod probes;
mod runtime;
mod scheduler;
mod service_proxy;
mod status;
mod storage;
mod volumes;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use kube::runtime::reflector;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub use config::NodeConfig;
pub use images::{EXAMPLE_AGENT_IMAGES, ImageTable, Runner, repository};
pub use service_proxy::ServiceProxy;
pub use storage::PROVISIONED_BY;

use kubelet::{PodEntry, PodTable};
use node::NodeCtx;

/// A running node. Stops every container and removes its network
/// namespaces when dropped.
pub struct TestNode {
    ctx: Arc<NodeCtx>,
    pods: PodTable,
    tasks: Vec<JoinHandle<()>>,
    stopped: bool,
}

impl TestNode {
    /// Registers the node, starts watching the cluster and returns once
    /// the node is Ready and its view of the cluster is loaded.
    pub async fn start(client: kube::Client, config: NodeConfig) -> anyhow::Result<TestNode> {
        prepare_work_dir(&config.work_dir)?;
        let net = tokio::task::spawn_blocking(network::NodeNetwork::create)
            .await
            .context("network setup task")??;
        let api_relay = match config.api_server {
            Some(upstream) => Some(
                api_proxy::start(net.host_ip(), upstream)
                    .await
                    .context("starting the API server relay")?,
            ),
            None => None,
        };
        let changed = Arc::new(Notify::new());
        let (pod_store, pod_writer) = reflector::store();
        let (service_store, service_writer) = reflector::store();
        let (claim_store, claim_writer) = reflector::store();
        let ctx = Arc::new(NodeCtx::new(
            client.clone(),
            config,
            net,
            pod_store.clone(),
            service_store.clone(),
            api_relay.as_ref().map(|(port, _)| *port),
        ));
        let pods: PodTable = Arc::new(Mutex::new(HashMap::new()));
        let mut node = TestNode {
            ctx: ctx.clone(),
            pods: pods.clone(),
            tasks: Vec::new(),
            stopped: false,
        };
        node.ctx
            .register()
            .await
            .with_context(|| format!("registering node {}", node.ctx.name()))?;
        if let Some((_, relay)) = api_relay {
            node.tasks.push(relay);
        }
        node.tasks.push(tokio::spawn(ctx.clone().heartbeat()));
        node.tasks.push(kubelet::reflect(
            client.clone(),
            pod_writer,
            changed.clone(),
        ));
        node.tasks.push(kubelet::reflect(
            client.clone(),
            service_writer,
            changed.clone(),
        ));
        node.tasks
            .push(kubelet::reflect(client, claim_writer, changed.clone()));
        let loaded = async {
            pod_store.wait_until_ready().await?;
            service_store.wait_until_ready().await?;
            claim_store.wait_until_ready().await
        };
        tokio::time::timeout(Duration::from_secs(60), loaded)
            .await
            .context("timed out loading pods, services and claims")?
            .context("watch ended")?;
        node.tasks.push(tokio::spawn(kubelet::sync_loop(
            ctx.clone(),
            pods,
            claim_store,
            changed,
        )));
        tracing::info!(
            node = node.ctx.name(),
            pod_cidr = node.ctx.net.pod_cidr(),
            "test node ready"
        );
        Ok(node)
    }

    /// The Node object's name.
    pub fn name(&self) -> &str {
        self.ctx.name()
    }

    /// The node's address (its InternalIP, the pods' gateway).
    pub fn host_ip(&self) -> IpAddr {
        IpAddr::V4(self.ctx.net.host_ip())
    }

    /// Stops every container at once (no hooks, no grace), removes the
    /// network namespaces and the bridge. The Node object and the pods'
    /// objects stay, as when a machine goes away.
    pub async fn stop(mut self) {
        self.ctx.begin_shutdown();
        let workers: Vec<JoinHandle<()>> = {
            let mut table = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            table.drain().map(|(_, entry)| entry.task).collect()
        };
        let all = futures::future::join_all(workers);
        if tokio::time::timeout(Duration::from_secs(15), all)
            .await
            .is_err()
        {
            tracing::warn!(node = self.name(), "pod workers did not stop in 15 s");
        }
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.ctx.begin_shutdown();
        for task in &self.tasks {
            task.abort();
        }
        for (_, entry) in self.pods.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            entry.task.abort();
        }
        self.ctx.net.destroy_all();
    }

    /// The pod's IP on this node (the running incarnation if the name was
    /// reused).
    pub fn pod_ip(&self, namespace: &str, pod: &str) -> Option<IpAddr> {
        self.with_entry(namespace, pod, |e| e.shared.read(|s| s.ip))
            .flatten()
            .map(IpAddr::V4)
    }

    /// The pid of a container's running process, to kill or stop it.
    pub fn pid_of(&self, namespace: &str, pod: &str, container: &str) -> Option<u32> {
        self.with_entry(namespace, pod, |e| {
            e.shared.read(|s| {
                s.containers
                    .iter()
                    .find(|c| c.name == container)
                    .and_then(|c| c.pid)
            })
        })
        .flatten()
    }

    /// The pod's network namespace (`ip netns exec <it> …` runs a command
    /// as if inside the pod).
    pub fn netns_of(&self, namespace: &str, pod: &str) -> Option<String> {
        self.with_entry(namespace, pod, |e| e.shared.read(|s| s.netns.clone()))
            .flatten()
    }

    /// Where a container's stdout and stderr go (appended across restarts).
    pub fn log_path(&self, namespace: &str, pod: &str, container: &str) -> PathBuf {
        volumes::pod_root(&self.ctx.config.work_dir, namespace, pod)
            .join(format!("{container}.log"))
    }

    /// Prints every pod of `namespace` with its phase and the end of its
    /// containers' logs, for a test that failed waiting on them.
    pub async fn print_pods(&self, namespace: &str) {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.ctx.client.clone(), namespace);
        let list = pods
            .list(&kube::api::ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for pod in list {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let logs = self.logs(namespace, &name);
            let lines: Vec<&str> = logs.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            eprintln!("---- pod {namespace}/{name}: {phase} ----\n{tail}");
        }
    }

    /// Every container log of a pod, for a test to print on failure.
    pub fn logs(&self, namespace: &str, pod: &str) -> String {
        let dir = volumes::pod_root(&self.ctx.config.work_dir, namespace, pod);
        let mut out = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        files.sort();
        for file in files {
            out.push_str(&format!("==> {} <==\n", file.display()));
            out.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
        }
        out
    }

    /// Runs `f` on the entry of pod `namespace/name`, preferring the
    /// incarnation that is not being deleted.
    fn with_entry<R>(&self, namespace: &str, name: &str, f: impl Fn(&PodEntry) -> R) -> Option<R> {
        let table = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let mut matching: Vec<&PodEntry> = table
            .values()
            .filter(|e| e.namespace == namespace && e.name == name && !e.task.is_finished())
            .collect();
        matching.sort_by_key(|e| e.updates.borrow().metadata.deletion_timestamp.is_some());
        matching.first().map(|e| f(e))
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

/// Creates `work_dir` and opens it to every user: Postgres, running as
/// `postgres`, must reach its data directory inside.
fn prepare_work_dir(work_dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    std::fs::set_permissions(work_dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The `baton` binary for [`ImageTable::standard`]: `$BATON_BIN`, else
/// `baton` in the Cargo profile directory of the running test executable
/// (`target/<profile>/deps/<test>` → `target/<profile>/baton`).
pub fn locate_baton_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("BATON_BIN") {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|dir| dir.join("baton"))
        .find(|candidate| candidate.is_file())
}
