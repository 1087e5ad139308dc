//! The desired state of one `AgentDeployment`, as pure functions.
//!
//! [`build`] turns a validated resource (and the credentials of its managed
//! stores) into every Kubernetes object it needs. Nothing here talks to a
//! cluster or draws random numbers: the same input gives the same objects,
//! which is what `baton render` prints and what the operator applies.
#![forbid(unsafe_code)]

mod credentials;
pub mod meta;
pub mod network;
mod parts;
pub mod replicas;
pub mod stores;

use baton_api::ValidAgentDeployment;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use credentials::Credentials;
pub use network::AdminClients;
pub use replicas::RuntimeConfig;

/// What the cluster adds to an `AgentDeployment`'s objects, beyond its spec:
/// the operator's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Platform {
    /// NetworkPolicies admitting these admin clients; none when `None`
    /// (the operator's `--network-policies=false`).
    pub network_policies: Option<AdminClients>,
}

/// Every object of one `AgentDeployment`, by kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredState {
    pub service_account: Option<ServiceAccount>,
    pub secrets: Vec<Secret>,
    pub config_maps: Vec<ConfigMap>,
    pub services: Vec<Service>,
    pub network_policies: Vec<NetworkPolicy>,
    /// Stores first, the replicas last.
    pub stateful_sets: Vec<StatefulSet>,
    pub jobs: Vec<Job>,
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
}

/// The kinds of child objects, in the order they are applied: what others
/// refer to (ServiceAccount, Secrets, ConfigMaps, Services) before what
/// refers to them (StatefulSets, Jobs), the NetworkPolicies before the pods
/// they guard, the disruption budget last. Pruning goes in reverse. The
/// derived order is that order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChildKind {
    ServiceAccount,
    Secret,
    ConfigMap,
    Service,
    NetworkPolicy,
    StatefulSet,
    Job,
    PodDisruptionBudget,
}

impl ChildKind {
    /// Every kind, in apply order.
    pub const ALL: [Self; 8] = [
        Self::ServiceAccount,
        Self::Secret,
        Self::ConfigMap,
        Self::Service,
        Self::NetworkPolicy,
        Self::StatefulSet,
        Self::Job,
        Self::PodDisruptionBudget,
    ];

    /// The kind as in an object's `kind` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServiceAccount => "ServiceAccount",
            Self::Secret => "Secret",
            Self::ConfigMap => "ConfigMap",
            Self::Service => "Service",
            Self::NetworkPolicy => "NetworkPolicy",
            Self::StatefulSet => "StatefulSet",
            Self::Job => "Job",
            Self::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }
}

impl std::fmt::Display for ChildKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One child object, any kind. Serialises as the object itself.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChildObject {
    ServiceAccount(ServiceAccount),
    Secret(Secret),
    ConfigMap(ConfigMap),
    Service(Service),
    NetworkPolicy(NetworkPolicy),
    StatefulSet(StatefulSet),
    Job(Job),
    PodDisruptionBudget(PodDisruptionBudget),
}

impl ChildObject {
    /// The object's kind.
    pub fn kind(&self) -> ChildKind {
        match self {
            Self::ServiceAccount(_) => ChildKind::ServiceAccount,
            Self::Secret(_) => ChildKind::Secret,
            Self::ConfigMap(_) => ChildKind::ConfigMap,
            Self::Service(_) => ChildKind::Service,
            Self::NetworkPolicy(_) => ChildKind::NetworkPolicy,
            Self::StatefulSet(_) => ChildKind::StatefulSet,
            Self::Job(_) => ChildKind::Job,
            Self::PodDisruptionBudget(_) => ChildKind::PodDisruptionBudget,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::ServiceAccount(o) => &o.metadata,
            Self::Secret(o) => &o.metadata,
            Self::ConfigMap(o) => &o.metadata,
            Self::Service(o) => &o.metadata,
            Self::NetworkPolicy(o) => &o.metadata,
            Self::StatefulSet(o) => &o.metadata,
            Self::Job(o) => &o.metadata,
            Self::PodDisruptionBudget(o) => &o.metadata,
        }
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::ServiceAccount(o) => &mut o.metadata,
            Self::Secret(o) => &mut o.metadata,
            Self::ConfigMap(o) => &mut o.metadata,
            Self::Service(o) => &mut o.metadata,
            Self::NetworkPolicy(o) => &mut o.metadata,
            Self::StatefulSet(o) => &mut o.metadata,
            Self::Job(o) => &mut o.metadata,
            Self::PodDisruptionBudget(o) => &mut o.metadata,
        }
    }

    /// The object's name (every built object has one).
    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }
}

impl DesiredState {
    /// The objects in the order they are applied ([`ChildKind`]'s order).
    pub fn into_objects(self) -> Vec<ChildObject> {
        // No `..`: a new kind added to DesiredState must be placed here.
        let DesiredState {
            service_account,
            secrets,
            config_maps,
            services,
            network_policies,
            stateful_sets,
            jobs,
            pod_disruption_budgets,
        } = self;
        let mut objects: Vec<ChildObject> = service_account
            .into_iter()
            .map(ChildObject::ServiceAccount)
            .collect();
        objects.extend(secrets.into_iter().map(ChildObject::Secret));
        objects.extend(config_maps.into_iter().map(ChildObject::ConfigMap));
        objects.extend(services.into_iter().map(ChildObject::Service));
        objects.extend(network_policies.into_iter().map(ChildObject::NetworkPolicy));
        objects.extend(stateful_sets.into_iter().map(ChildObject::StatefulSet));
        objects.extend(jobs.into_iter().map(ChildObject::Job));
        objects.extend(
            pod_disruption_budgets
                .into_iter()
                .map(ChildObject::PodDisruptionBudget),
        );
        objects
    }

    /// The replica StatefulSet (always the last one).
    pub fn replicas(&self) -> &StatefulSet {
        self.stateful_sets
            .last()
            .expect("build always adds the replica StatefulSet")
    }
}

/// Digest of a Secret's data, so credentials feed the config hash without
/// being copied anywhere.
fn secret_digest(secret: &Secret) -> (String, Vec<u8>) {
    let mut hasher = Sha256::new();
    for (k, v) in secret.data.iter().flatten() {
        hasher.update(k.as_bytes());
        hasher.update([0]);
        hasher.update(&v.0);
        hasher.update([0]);
    }
    (
        secret.metadata.name.clone().unwrap_or_default(),
        hasher.finalize().to_vec(),
    )
}

/// Builds every child object of `agd`.
pub fn build(agd: &ValidAgentDeployment, creds: &Credentials, platform: &Platform) -> DesiredState {
    let mut state = DesiredState {
        service_account: replicas::service_account(agd),
        ..DesiredState::default()
    };

    let redis = stores::redis(agd, creds);
    let postgres = stores::postgres(agd, creds);
    let minio = stores::minio(agd, creds);
    let (minio, bucket_job) = minio.unzip();
    let mut managed_stores = false;
    for store in [redis, postgres, minio].into_iter().flatten() {
        managed_stores = true;
        state.secrets.push(store.secret);
        state.services.push(store.service);
        state.stateful_sets.push(store.stateful_set);
    }
    state.jobs.extend(bucket_job);
    state.secrets.push(replicas::admin_secret(agd, creds));

    let config = RuntimeConfig::new(agd);
    let digests: Vec<_> = state.secrets.iter().map(secret_digest).collect();
    let hash = replicas::config_hash(&config, &digests);

    state.config_maps.push(replicas::config_map(agd, &config));
    state.services.push(replicas::client_service(agd));
    state.services.push(replicas::headless_service(agd));
    state.stateful_sets.push(replicas::stateful_set(agd, &hash));
    state
        .pod_disruption_budgets
        .push(replicas::pod_disruption_budget(agd));
    if let Some(clients) = &platform.network_policies {
        state.network_policies.push(network::replicas(agd, clients));
        if managed_stores {
            state.network_policies.push(network::stores(agd, clients));
        }
    }
    state
}
