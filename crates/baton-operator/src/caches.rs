//! Watch caches of every kind the operator owns, filled by the same watches
//! that trigger reconciles. Children are found by the `managed-by` label;
//! Secrets are cached with their data, StatefulSets and Jobs with their
//! status (not their spec), the rest as metadata only.

use std::fmt::Debug;

use baton_api::constants::labels;
use baton_resources::ChildKind;
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::metrics::{KindLabel, Metrics};

/// Where the operator looks: one namespace or all of them.
#[derive(Clone, Debug)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        match self {
            Self::All => Api::all(client.clone()),
            Self::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }
}

pub struct Caches {
    /// The kinds whose cache has not been filled yet; empty once all are.
    unready: tokio::sync::watch::Receiver<Vec<&'static str>>,
    pub service_accounts: Store<PartialObjectMeta<ServiceAccount>>,
    pub secrets: Store<Secret>,
    pub config_maps: Store<PartialObjectMeta<ConfigMap>>,
    pub services: Store<PartialObjectMeta<Service>>,
    pub stateful_sets: Store<StatefulSet>,
    pub jobs: Store<Job>,
    pub network_policies: Store<PartialObjectMeta<NetworkPolicy>>,
    pub pod_disruption_budgets: Store<PartialObjectMeta<PodDisruptionBudget>>,
    pub pods: Store<Pod>,
}

type Watched<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// The watch streams, to be polled by the controller.
pub struct Streams {
    pub service_accounts: Watched<PartialObjectMeta<ServiceAccount>>,
    pub secrets: Watched<Secret>,
    pub config_maps: Watched<PartialObjectMeta<ConfigMap>>,
    pub services: Watched<PartialObjectMeta<Service>>,
    pub stateful_sets: Watched<StatefulSet>,
    pub jobs: Watched<Job>,
    pub network_policies: Watched<PartialObjectMeta<NetworkPolicy>>,
    pub pod_disruption_budgets: Watched<PartialObjectMeta<PodDisruptionBudget>>,
    pub pods: Watched<Pod>,
}

fn children_config() -> watcher::Config {
    watcher::Config::default()
        .labels(&format!(
            "{}={}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE
        ))
        .any_semantic()
}

/// Drops what the operator never reads from a cached object: the field sets
/// of its managed fields (only who applied or updated it, and when, decide
/// whether to apply again). They are most of an object's metadata.
fn slim<K: Resource>(object: &mut K) {
    for entry in object.meta_mut().managed_fields.iter_mut().flatten() {
        entry.fields_v1 = None;
    }
}

fn full<K>(client: &Client, scope: &Scope, trim: fn(&mut K)) -> (Store<K>, Watched<K>)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(scope.api::<K>(client), children_config())
        .default_backoff()
        .modify(trim)
        .reflect(writer)
        .touched_objects()
        .boxed();
    (reader, stream)
}

fn metadata<K>(
    client: &Client,
    scope: &Scope,
) -> (Store<PartialObjectMeta<K>>, Watched<PartialObjectMeta<K>>)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    // An Api of PartialObjectMeta makes metadata-only requests.
    let stream = watcher(scope.api::<PartialObjectMeta<K>>(client), children_config())
        .default_backoff()
        .modify(slim)
        .reflect(writer)
        .touched_objects()
        .boxed();
    (reader, stream)
}

pub fn start(client: &Client, scope: &Scope) -> (Caches, Streams) {
    let (service_accounts, sa) = metadata::<ServiceAccount>(client, scope);
    let (secrets, sec) = full::<Secret>(client, scope, slim);
    let (config_maps, cm) = metadata::<ConfigMap>(client, scope);
    let (services, svc) = metadata::<Service>(client, scope);
    // A StatefulSet or Job is read for its metadata and status (and a
    // StatefulSet's replica count) only; the pod template is most of its size.
    let (stateful_sets, sts) = full::<StatefulSet>(client, scope, |o| {
        slim(o);
        o.spec = o.spec.take().map(|spec| StatefulSetSpec {
            replicas: spec.replicas,
            ..StatefulSetSpec::default()
        });
    });
    let (jobs, job) = full::<Job>(client, scope, |o| {
        slim(o);
        o.spec = None;
    });
    let (network_policies, netpol) = metadata::<NetworkPolicy>(client, scope);
    let (pod_disruption_budgets, pdb) = metadata::<PodDisruptionBudget>(client, scope);
    // Pods for their readiness, IP and revision: the status and the rollout.
    let (pods, pod) = full::<Pod>(client, scope, |o| {
        slim(o);
        o.spec = None;
    });
    let (mark, unready) = tokio::sync::watch::channel(Vec::new());
    watch_readiness(&mark, "ServiceAccount", &service_accounts);
    watch_readiness(&mark, "Secret", &secrets);
    watch_readiness(&mark, "ConfigMap", &config_maps);
    watch_readiness(&mark, "Service", &services);
    watch_readiness(&mark, "StatefulSet", &stateful_sets);
    watch_readiness(&mark, "Job", &jobs);
    watch_readiness(&mark, "NetworkPolicy", &network_policies);
    watch_readiness(&mark, "PodDisruptionBudget", &pod_disruption_budgets);
    watch_readiness(&mark, "Pod", &pods);
    (
        Caches {
            unready,
            service_accounts,
            secrets,
            config_maps,
            services,
            stateful_sets,
            jobs,
            network_policies,
            pod_disruption_budgets,
            pods,
        },
        Streams {
            service_accounts: sa,
            secrets: sec,
            config_maps: cm,
            services: svc,
            stateful_sets: sts,
            jobs: job,
            network_policies: netpol,
            pod_disruption_budgets: pdb,
            pods: pod,
        },
    )
}

/// Marks `kind` unready until its store has been filled once.
///
/// `Store::wait_until_ready` remembers one waiter only (a oneshot receiver
/// behind a mutex): with several reconciles waiting on it at once, all but
/// the last one polled are never woken. So exactly one task waits on each
/// store, and reconciles wait on a watch channel, which wakes every waiter.
fn watch_readiness<K>(
    mark: &tokio::sync::watch::Sender<Vec<&'static str>>,
    kind: &'static str,
    store: &Store<K>,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    mark.send_modify(|unready| unready.push(kind));
    let mark = mark.clone();
    let store = store.clone();
    tokio::spawn(async move {
        // Err: the writer is gone, the operator is stopping; stay unready.
        if store.wait_until_ready().await.is_ok() {
            mark.send_modify(|unready| unready.retain(|k| *k != kind));
        }
    });
}

fn key<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> ObjectRef<K> {
    ObjectRef::new(name).within(namespace)
}

impl Caches {
    /// Waits until every cache has been filled once.
    pub async fn wait_until_ready(&self) {
        let mut unready = self.unready.clone();
        // Err: every readiness task is gone, the operator is stopping.
        let _ = unready.wait_for(Vec::is_empty).await;
    }

    /// The kinds whose cache has not been filled yet: their watch fails
    /// (most often a right missing from the operator's role) or is slow.
    pub fn unready_kinds(&self) -> Vec<&'static str> {
        self.unready.borrow().clone()
    }

    /// Metadata of the cached child of `kind`.
    pub fn meta(&self, kind: ChildKind, namespace: &str, name: &str) -> Option<ObjectMeta> {
        match kind {
            ChildKind::ServiceAccount => self
                .service_accounts
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
            ChildKind::Secret => self
                .secrets
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
            ChildKind::ConfigMap => self
                .config_maps
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
            ChildKind::Service => self
                .services
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
            ChildKind::NetworkPolicy => self
                .network_policies
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
            ChildKind::StatefulSet => self
                .stateful_sets
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
            ChildKind::Job => self
                .jobs
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
            ChildKind::PodDisruptionBudget => self
                .pod_disruption_budgets
                .get(&key(namespace, name))
                .map(|o| o.metadata.clone()),
        }
    }

    /// Every cached child in `namespace` controlled by `owner_uid`, with
    /// its kind. Only those are copied: a reconcile holds its own children,
    /// not every object of a namespace shared by many resources.
    pub fn children_of(&self, namespace: &str, owner_uid: &str) -> Vec<(ChildKind, ObjectMeta)> {
        fn collect<K: Resource<DynamicType = ()> + Clone>(
            out: &mut Vec<(ChildKind, ObjectMeta)>,
            kind: ChildKind,
            store: &Store<K>,
            namespace: &str,
            owner_uid: &str,
        ) {
            out.extend(
                store
                    .state()
                    .iter()
                    .map(|o| Resource::meta(o.as_ref()))
                    .filter(|m| {
                        m.namespace.as_deref() == Some(namespace)
                            && crate::children::controlled_by(m, owner_uid)
                    })
                    .map(|m| (kind, m.clone())),
            );
        }
        let mut out = Vec::new();
        for kind in ChildKind::ALL {
            // Exhaustive: a new kind must say which cache holds it.
            match kind {
                ChildKind::ServiceAccount => {
                    collect(&mut out, kind, &self.service_accounts, namespace, owner_uid)
                }
                ChildKind::Secret => collect(&mut out, kind, &self.secrets, namespace, owner_uid),
                ChildKind::ConfigMap => {
                    collect(&mut out, kind, &self.config_maps, namespace, owner_uid)
                }
                ChildKind::Service => collect(&mut out, kind, &self.services, namespace, owner_uid),
                ChildKind::NetworkPolicy => {
                    collect(&mut out, kind, &self.network_policies, namespace, owner_uid)
                }
                ChildKind::StatefulSet => {
                    collect(&mut out, kind, &self.stateful_sets, namespace, owner_uid)
                }
                ChildKind::Job => collect(&mut out, kind, &self.jobs, namespace, owner_uid),
                ChildKind::PodDisruptionBudget => collect(
                    &mut out,
                    kind,
                    &self.pod_disruption_budgets,
                    namespace,
                    owner_uid,
                ),
            }
        }
        out
    }

    pub fn secret(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Secret>> {
        self.secrets.get(&key(namespace, name))
    }

    pub fn stateful_set(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<StatefulSet>> {
        self.stateful_sets.get(&key(namespace, name))
    }

    /// The pods a StatefulSet controls.
    pub fn pods_of(&self, namespace: &str, stateful_set_uid: &str) -> Vec<std::sync::Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && crate::children::controlled_by(&p.metadata, stateful_set_uid)
            })
            .collect()
    }

    pub fn job(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Job>> {
        self.jobs.get(&key(namespace, name))
    }

    /// Publishes the cache sizes as the `watched_objects` gauge.
    pub fn report(&self, metrics: &Metrics) {
        let sizes = [
            ("ServiceAccount", self.service_accounts.state().len()),
            ("Secret", self.secrets.state().len()),
            ("ConfigMap", self.config_maps.state().len()),
            ("Service", self.services.state().len()),
            ("StatefulSet", self.stateful_sets.state().len()),
            ("Job", self.jobs.state().len()),
            ("NetworkPolicy", self.network_policies.state().len()),
            (
                "PodDisruptionBudget",
                self.pod_disruption_budgets.state().len(),
            ),
            ("Pod", self.pods.state().len()),
        ];
        for (kind, size) in sizes {
            metrics
                .watched
                .get_or_create(&KindLabel { kind })
                .set(i64::try_from(size).unwrap_or(i64::MAX));
        }
    }
}
