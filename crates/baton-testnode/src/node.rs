//! The node's shared context, its Node object and its heartbeats: the
//! Lease in `kube-node-lease` and the Ready condition's heartbeat time,
//! renewed every 10 s, so the node-lifecycle controller never taints the
//! node or evicts its pods.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use serde_json::json;
use tokio::sync::watch;

use crate::NodeConfig;
use crate::network::{NodeNetwork, Sandbox, netns_etc, write_in_place};

/// Field manager of every server-side apply this node makes.
const MANAGER: &str = "baton-testnode";
const HEARTBEAT: Duration = Duration::from_secs(10);

/// What every task of the node shares.
pub(crate) struct NodeCtx {
    pub client: kube::Client,
    pub config: NodeConfig,
    pub net: NodeNetwork,
    pub http: reqwest::Client,
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    shutdown: watch::Sender<bool>,
    registered_at: Timestamp,
    /// Port of the API server relay on the bridge address (`NodeConfig::api_server`).
    pub api_port: Option<u16>,
    /// Last contents written to each pod's hosts file, by netns.
    hosts: Mutex<HashMap<String, String>>,
}

impl NodeCtx {
    pub fn new(
        client: kube::Client,
        config: NodeConfig,
        net: NodeNetwork,
        pods: Store<Pod>,
        services: Store<Service>,
        api_port: Option<u16>,
    ) -> Self {
        Self {
            client,
            config,
            net,
            http: crate::probes::http_client(),
            pods,
            services,
            api_port,
            shutdown: watch::Sender::new(false),
            registered_at: Timestamp::now(),
            hosts: Mutex::new(HashMap::new()),
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Rewrites the hosts file of `pod`'s sandbox if its contents changed.
    pub fn dns_write(&self, pod: &Pod, sandbox: &Sandbox) {
        self.dns_write_at(pod, &sandbox.netns, sandbox.ip);
    }

    pub fn dns_write_at(&self, pod: &Pod, netns: &str, ip: std::net::Ipv4Addr) {
        let api_host = self.api_port.map(|_| self.net.host_ip());
        let contents = crate::dns::hosts_file(
            pod,
            ip,
            &self.pods.state(),
            &self.services.state(),
            api_host,
        );
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        if hosts.get(netns) == Some(&contents) {
            return;
        }
        let path = netns_etc(netns).join("hosts");
        match write_in_place(&path, &contents) {
            Ok(()) => {
                hosts.insert(netns.to_owned(), contents);
            }
            Err(e) => tracing::debug!(path = %path.display(), "writing the hosts file: {e}"),
        }
    }

    pub fn dns_forget(&self, netns: &str) {
        self.hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(netns);
    }

    fn node_object(&self) -> serde_json::Value {
        let name = self.name();
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                    "baton.dev/test-node": "true",
                },
            },
        })
    }

    fn node_status(&self) -> serde_json::Value {
        let now = Time(Timestamp::now());
        let since = Time(self.registered_at);
        let resources = json!({
            "cpu": "64",
            "memory": "256Gi",
            "pods": "500",
            "ephemeral-storage": "1Ti",
        });
        let condition = |type_: &str, status: &str, reason: &str, message: &str| {
            json!({
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": since,
            })
        };
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name()},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    condition("Ready", "True", "KubeletReady", "baton-testnode is posting ready status"),
                ],
                "addresses": [
                    {"type": "InternalIP", "address": self.net.host_ip().to_string()},
                    {"type": "Hostname", "address": self.name()},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "machineID": "baton-testnode",
                    "systemUUID": "baton-testnode",
                    "bootID": "baton-testnode",
                    "kernelVersion": "",
                    "osImage": "baton-testnode",
                    "containerRuntimeVersion": "testnode://0.1",
                    "kubeletVersion": "v1.34.2",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        })
    }

    /// Creates or updates the Node and its status.
    pub async fn register(&self) -> kube::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let params = PatchParams::apply(MANAGER).force();
        nodes
            .patch(self.name(), &params, &Patch::Apply(self.node_object()))
            .await?;
        nodes
            .patch_status(self.name(), &params, &Patch::Apply(self.node_status()))
            .await?;
        self.renew_lease().await
    }

    async fn renew_lease(&self) -> kube::Result<()> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), "kube-node-lease");
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name()},
            "spec": {
                "holderIdentity": self.name(),
                "leaseDurationSeconds": 40,
                "renewTime": MicroTime(Timestamp::now()),
            },
        });
        leases
            .patch(
                self.name(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(lease),
            )
            .await?;
        Ok(())
    }

    /// Heartbeats forever: the Lease and the Node's conditions every 10 s
    /// (a failed beat is retried after a second).
    pub async fn heartbeat(self: Arc<Self>) {
        loop {
            let delay = match self.register().await {
                Ok(()) => HEARTBEAT,
                Err(e) => {
                    tracing::warn!(node = self.name(), "heartbeat failed: {e}");
                    Duration::from_secs(1)
                }
            };
            tokio::time::sleep(delay).await;
        }
    }
}
