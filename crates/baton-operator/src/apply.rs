//! Writes to the API server: server-side apply of a child (one field
//! manager, forced: the operator owns what it builds) and deletion of a
//! pruned one.

use std::fmt::Debug;
use std::time::Duration;

use baton_api::constants::FIELD_MANAGER;
use baton_resources::{ChildKind, ChildObject};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::children::ChildKey;

/// Attempts of a write the API server answered with 409 Conflict (another
/// writer got in between); the controller's backoff covers the rest.
const CONFLICT_ATTEMPTS: u32 = 3;

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Applies `object` in `namespace`; returns the metadata the server answered with.
pub async fn apply(
    client: &Client,
    namespace: &str,
    object: &ChildObject,
) -> kube::Result<ObjectMeta> {
    match object {
        ChildObject::ServiceAccount(o) => apply_typed(client, namespace, o).await,
        ChildObject::Secret(o) => apply_typed(client, namespace, o).await,
        ChildObject::ConfigMap(o) => apply_typed(client, namespace, o).await,
        ChildObject::Service(o) => apply_typed(client, namespace, o).await,
        ChildObject::NetworkPolicy(o) => apply_typed(client, namespace, o).await,
        ChildObject::StatefulSet(o) => apply_typed(client, namespace, o).await,
        ChildObject::Job(o) => apply_typed(client, namespace, o).await,
        ChildObject::PodDisruptionBudget(o) => apply_typed(client, namespace, o).await,
    }
}

async fn apply_typed<K>(client: &Client, namespace: &str, object: &K) -> kube::Result<ObjectMeta>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = object.meta().name.clone().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut attempt = 1;
    loop {
        match api.patch(&name, &params, &Patch::Apply(object)).await {
            Ok(applied) => return Ok(applied.meta().clone()),
            Err(error) if is_conflict(&error) && attempt < CONFLICT_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Deletes a pruned child. Dependents (a Job's pods, a StatefulSet's pods)
/// go in the background; a StatefulSet's volume claims stay, as always.
pub async fn delete(client: &Client, namespace: &str, key: &ChildKey) -> kube::Result<()> {
    let params = DeleteParams::background();
    let name = key.name.as_str();
    let result = match key.kind {
        ChildKind::ServiceAccount => {
            delete_typed::<ServiceAccount>(client, namespace, name, &params).await
        }
        ChildKind::Secret => delete_typed::<Secret>(client, namespace, name, &params).await,
        ChildKind::ConfigMap => delete_typed::<ConfigMap>(client, namespace, name, &params).await,
        ChildKind::Service => delete_typed::<Service>(client, namespace, name, &params).await,
        ChildKind::NetworkPolicy => {
            delete_typed::<NetworkPolicy>(client, namespace, name, &params).await
        }
        ChildKind::StatefulSet => {
            delete_typed::<StatefulSet>(client, namespace, name, &params).await
        }
        ChildKind::Job => delete_typed::<Job>(client, namespace, name, &params).await,
        ChildKind::PodDisruptionBudget => {
            delete_typed::<PodDisruptionBudget>(client, namespace, name, &params).await
        }
    };
    match result {
        // Already gone: what we wanted.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}

async fn delete_typed<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    params: &DeleteParams,
) -> kube::Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.delete(name, params).await.map(|_| ())
}
