//! The cluster view, when the dashboard has Kubernetes access
//! (`--kubernetes`: the kubeconfig, or the pod's service account): every
//! `AgentDeployment` it may list, with its replicas, revisions, rollout and
//! conditions; and a Kubernetes event on this deployment's
//! `AgentDeployment` for every action (its store namespace,
//! `<namespace>.<name>`, names it); and the addresses of that
//! deployment's sidecar admin APIs, the only ones the dashboard calls with
//! its admin token (the EndpointSlices of its headless Service, watched).

use baton_api::AgentDeployment;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::model::{AuditEntry, ConditionRow, DeploymentRow};

pub struct Cluster {
    client: kube::Client,
    /// Lists this namespace only; every namespace when `None`.
    namespace: Option<String>,
    /// The `AgentDeployment` whose stores the dashboard reads.
    deployment: Option<(String, String)>,
    recorder: Recorder,
}

impl Cluster {
    /// Connects with the default client configuration (`KUBECONFIG`,
    /// `~/.kube/config`, or in-cluster).
    pub async fn connect(namespace: Option<String>, store_namespace: &str) -> Result<Self, String> {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("Kubernetes: no client configuration: {e}"))?;
        let deployment = store_namespace
            .split_once('.')
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()));
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "baton-dashboard".into(),
                instance: std::env::var("HOSTNAME").ok(),
            },
        );
        Ok(Self {
            client,
            namespace,
            deployment,
            recorder,
        })
    }

    fn api(&self) -> Api<AgentDeployment> {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    pub async fn deployments(&self) -> Result<Vec<DeploymentRow>, String> {
        let list = self
            .api()
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing AgentDeployments: {}", reason(&e)))?;
        Ok(list.items.iter().map(row).collect())
    }

    /// The admin addresses (pod IP, admin port) of this deployment's
    /// sidecars, ready or not (the headless Service publishes draining pods
    /// too), kept current by a watch of the Service's EndpointSlices; `None`
    /// when the store namespace names no deployment.
    pub fn admin_endpoints(
        &self,
    ) -> Option<std::sync::Arc<dyn Fn() -> Vec<std::net::SocketAddr> + Send + Sync>> {
        use futures::StreamExt as _;
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::runtime::{WatchStreamExt as _, reflector, watcher};
        let (namespace, name) = self.deployment.as_ref()?;
        let service = baton_api::names::ChildNames::new(name.as_str()).headless_service();
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), namespace);
        let config =
            watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
        let (store, writer) = reflector::store();
        let watch = watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .applied_objects();
        tokio::spawn(async move {
            futures::pin_mut!(watch);
            while let Some(event) = watch.next().await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "dashboard: watching the sidecars' EndpointSlices");
                }
            }
        });
        Some(std::sync::Arc::new(move || {
            store
                .state()
                .iter()
                .flat_map(|slice| admin_addresses(slice))
                .collect()
        }))
    }

    /// Publishes `entry` as an event on this deployment's `AgentDeployment`
    /// (nothing when the store namespace names none). Failures are logged:
    /// the action happened either way, and the audit log has it.
    pub async fn record(&self, entry: &AuditEntry) {
        let Some((namespace, name)) = &self.deployment else {
            return;
        };
        let api: Api<AgentDeployment> = Api::namespaced(self.client.clone(), namespace);
        let agd = match api.get(name).await {
            Ok(agd) => agd,
            Err(e) => {
                tracing::warn!(%namespace, %name, error = %e, "dashboard: no AgentDeployment for the audit event");
                return;
            }
        };
        let event = Event {
            type_: if entry.ok {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: match (entry.action.as_str(), entry.ok) {
                ("drain", true) => "DashboardDrain",
                ("drain", false) => "DashboardDrainFailed",
                (_, true) => "DashboardTakeover",
                (_, false) => "DashboardTakeoverFailed",
            }
            .into(),
            note: Some(
                format!(
                    "{} by {}: {} {}",
                    entry.action, entry.who, entry.target, entry.detail
                )
                .chars()
                .take(1000)
                .collect(),
            ),
            action: entry.action.clone(),
            secondary: None,
        };
        use kube::Resource as _;
        if let Err(e) = self.recorder.publish(&event, &agd.object_ref(&())).await {
            tracing::warn!(error = %e, "dashboard: publishing the audit event failed");
        }
    }
}

/// Every (address, admin port) of one EndpointSlice.
fn admin_addresses(
    slice: &k8s_openapi::api::discovery::v1::EndpointSlice,
) -> Vec<std::net::SocketAddr> {
    let ports: Vec<u16> = slice
        .ports
        .iter()
        .flatten()
        .filter(|p| p.name.as_deref() == Some(baton_api::constants::ports::SIDECAR_ADMIN_NAME))
        .filter_map(|p| p.port.and_then(|n| u16::try_from(n).ok()))
        .collect();
    slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .flat_map(|ip| {
            ports
                .iter()
                .map(move |port| std::net::SocketAddr::new(ip, *port))
        })
        .collect()
}

fn row(agd: &AgentDeployment) -> DeploymentRow {
    let status = agd.status.clone().unwrap_or_default();
    DeploymentRow {
        namespace: agd.metadata.namespace.clone().unwrap_or_default(),
        name: agd.metadata.name.clone().unwrap_or_default(),
        desired: agd.spec.replicas,
        replicas: status.replicas,
        ready: status.ready_replicas,
        updated: status.updated_replicas,
        current_revision: status.current_revision.unwrap_or_default(),
        update_revision: status.update_revision.unwrap_or_default(),
        rollout: status.rollout.as_ref().map(|r| r.summary()),
        conditions: status
            .conditions
            .into_iter()
            .map(|c| ConditionRow {
                type_: c.type_,
                status: c.status,
                reason: c.reason,
                message: c.message,
                since_ms: c.last_transition_time.0.as_millisecond().max(0) as u64,
            })
            .collect(),
    }
}

/// What the API server said, without the request's URL.
fn reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        _ => "the API server did not answer".into(),
    }
}
