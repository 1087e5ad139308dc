//! The first third of a reconcile: everything it decides from, read in one
//! place (the watch caches, the external Secrets, the ServiceAccount, the
//! sidecars of the replica pods) into one [`Observation`], a plain value
//! that [`crate::decide`] turns into actions without any I/O.
//!
//! What is read depends on what was read before, as it must: a spec that
//! fails validation reads nothing more, a refused ServiceAccount stops
//! before any sidecar is called.

use baton_api::constants::secret_keys;
use baton_api::names::ChildNames;
use baton_api::validate::Dependency;
use baton_api::{AgentDeployment, ValidAgentDeployment};
use baton_resources::Credentials;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};

use crate::caches::Caches;
use crate::children::ChildKey;
use crate::context::{Context, Error};
pub use crate::observation::{ExternalSecret, Observation, Stage, World};
use crate::rollout_io;
use crate::status::{ReplicaObservation, StoreObservation};

/// Reads what the reconcile of `agd` decides from.
pub async fn observe(agd: &AgentDeployment, ctx: &Context) -> Result<Observation, Error> {
    let namespace = agd.namespace().unwrap_or_default();
    let names = ChildNames::new(agd.name_any());
    let observation = |stage| Observation {
        agd: agd.clone(),
        now: Timestamp::now(),
        replicas: replica_observation(&ctx.caches, &namespace, &names),
        stage,
    };
    if agd.metadata.deletion_timestamp.is_some() {
        return Ok(observation(Stage::Deleting));
    }
    let mut valid = match baton_api::validate(agd) {
        Ok(valid) => valid,
        Err(errors) => {
            let violations = errors.0.iter().map(ToString::to_string).collect();
            return Ok(observation(Stage::Invalid(violations)));
        }
    };
    if valid.resource.spec.sidecar.image.is_none()
        && let Some(image) = &ctx.default_sidecar_image
    {
        valid.sidecar_image = image.clone();
    }
    if let Some(refusal) = service_account_refusal(&valid, &namespace, ctx).await? {
        return Ok(observation(Stage::AccountRefused(refusal)));
    }

    let credentials = managed_credentials(&valid, &namespace, &ctx.caches);
    let external_secrets = read_external_secrets(&valid, &namespace, ctx).await?;
    // The builder says which children exist for this spec; their live
    // metadata is looked up by name, whoever owns them.
    let desired = baton_resources::build(&valid, &credentials, &ctx.settings.platform);
    let live = desired
        .clone()
        .into_objects()
        .iter()
        .map(ChildKey::of)
        .filter_map(|key| {
            let meta = ctx.caches.meta(key.kind, &namespace, &key.name)?;
            Some((key, meta))
        })
        .collect();
    let owned = ctx
        .caches
        .children_of(&namespace, &agd.uid().unwrap_or_default());
    let stores = store_observations(&valid, &namespace, &ctx.caches);

    let sts = ctx.caches.stateful_set(&namespace, &valid.names.replicas());
    let live_replicas = sts
        .as_ref()
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.replicas);
    let update_revision = sts.as_ref().and_then(|s| {
        let status = s.status.as_ref()?;
        // Only a revision of the template the controller has seen.
        (status.observed_generation >= s.metadata.generation)
            .then(|| status.update_revision.clone())
            .flatten()
    });
    let pods = match sts.as_ref().and_then(|s| s.metadata.uid.clone()) {
        Some(uid) => rollout_io::replica_pods(
            &ctx.caches.pods_of(&namespace, &uid),
            &valid.names.replicas(),
            agd.status
                .as_ref()
                .and_then(|s| s.rollout.as_ref())
                .map_or(&[], |r| r.draining.as_slice()),
        ),
        None => Vec::new(),
    };
    let token = Some(credentials.admin_token.as_str());
    let probes = ctx.sidecars.probe_drains(&pods, token).await;
    let layout_mismatch = match update_revision.as_deref() {
        Some(update) => ctx.sidecars.probe_layouts(&pods, update, token).await,
        None => None,
    };

    Ok(observation(Stage::Valid(Box::new(World {
        valid,
        credentials,
        external_secrets,
        desired,
        live,
        owned,
        stores,
        live_replicas,
        update_revision,
        pods,
        probes,
        layout_mismatch,
    }))))
}

/// The replica StatefulSet of the resource named by `names`, as its status
/// says (also for a spec that fails validation: the status still counts
/// what runs).
pub fn replica_observation(
    caches: &Caches,
    namespace: &str,
    names: &ChildNames,
) -> Option<ReplicaObservation> {
    caches
        .stateful_set(namespace, &names.replicas())
        .map(|sts| {
            let status = sts.status.clone().unwrap_or_default();
            ReplicaObservation {
                up_to_date: status.observed_generation >= sts.metadata.generation,
                replicas: status.replicas,
                ready_replicas: status.ready_replicas.unwrap_or(0),
                updated_replicas: status.updated_replicas.unwrap_or(0),
                current_revision: status.current_revision,
                update_revision: status.update_revision,
            }
        })
}

fn store_observations(
    valid: &ValidAgentDeployment,
    namespace: &str,
    caches: &Caches,
) -> Vec<StoreObservation> {
    let store_ready = |name: &str| {
        caches
            .stateful_set(namespace, name)
            .and_then(|s| s.status.as_ref().and_then(|st| st.ready_replicas))
            .unwrap_or(0)
            >= 1
    };
    let mut stores = Vec::new();
    if matches!(valid.redis, Dependency::Managed(_)) {
        stores.push(StoreObservation {
            name: format!("redis (StatefulSet {})", valid.names.redis()),
            ready: store_ready(&valid.names.redis()),
        });
    }
    if matches!(valid.postgres, Dependency::Managed(_)) {
        stores.push(StoreObservation {
            name: format!("postgres (StatefulSet {})", valid.names.postgres()),
            ready: store_ready(&valid.names.postgres()),
        });
    }
    if matches!(valid.object_store, Dependency::Managed(_)) {
        stores.push(StoreObservation {
            name: format!("object store (StatefulSet {})", valid.names.minio()),
            ready: store_ready(&valid.names.minio()),
        });
        let bucket_made = caches
            .job(namespace, &valid.names.bucket_job())
            .and_then(|j| j.status.as_ref().and_then(|s| s.succeeded))
            .unwrap_or(0)
            >= 1;
        stores.push(StoreObservation {
            name: format!("bucket (Job {})", valid.names.bucket_job()),
            ready: bucket_made,
        });
    }
    stores
}

/// Credentials of the managed stores, read back from their Secrets so a
/// running database keeps its password; only missing ones are generated.
fn managed_credentials(
    valid: &ValidAgentDeployment,
    namespace: &str,
    caches: &Caches,
) -> Credentials {
    let data = |name: String| caches.secret(namespace, &name).and_then(|s| s.data.clone());
    let redis = data(valid.names.redis());
    let postgres = data(valid.names.postgres());
    let minio = data(valid.names.minio());
    let admin = data(valid.names.admin_secret());
    Credentials::reuse_or_generate(
        redis.as_ref(),
        postgres.as_ref(),
        minio.as_ref(),
        admin.as_ref(),
    )
}

/// Why `spec.serviceAccountName` may not be used, if it may not: it must
/// exist and carry `baton.dev/agent-service-account: "true"`.
async fn service_account_refusal(
    valid: &ValidAgentDeployment,
    namespace: &str,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let Some(name) = &valid.resource.spec.service_account_name else {
        return Ok(None);
    };
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), namespace);
    Ok(judge_service_account(
        namespace,
        name,
        api.get_opt(name).await?.as_ref(),
    ))
}

/// The rule itself: the account exists and is marked for agents.
pub fn judge_service_account(
    namespace: &str,
    name: &str,
    account: Option<&ServiceAccount>,
) -> Option<String> {
    let key = baton_api::constants::annotations::AGENT_SERVICE_ACCOUNT;
    match account {
        None => Some(format!(
            "spec.serviceAccountName: ServiceAccount {namespace}/{name} does not exist"
        )),
        Some(account)
            if account
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .is_some_and(|v| v == "true") =>
        {
            None
        }
        Some(_) => Some(format!(
            "spec.serviceAccountName: ServiceAccount {namespace}/{name} is not marked for agents; whoever may give pods that account annotates it {key}=true (kubectl annotate serviceaccount -n {namespace} {name} {key}=true)"
        )),
    }
}

/// Each external store Secret the spec names, read (not from the cache:
/// the operator watches only the Secrets it owns).
async fn read_external_secrets(
    valid: &ValidAgentDeployment,
    namespace: &str,
    ctx: &Context,
) -> Result<Vec<ExternalSecret>, Error> {
    let mut wanted: Vec<(String, Vec<String>, &'static str)> = Vec::new();
    if let Dependency::External(e) = &valid.redis {
        wanted.push((
            e.secret_ref.name.clone(),
            vec![e.secret_ref.url_key.clone()],
            "redis",
        ));
    }
    if let Dependency::External(e) = &valid.postgres {
        wanted.push((
            e.secret_ref.name.clone(),
            vec![e.secret_ref.url_key.clone()],
            "postgres",
        ));
    }
    if let Dependency::External(e) = &valid.object_store {
        let keys = [
            secret_keys::ENDPOINT,
            secret_keys::ACCESS_KEY_ID,
            secret_keys::SECRET_ACCESS_KEY,
        ];
        wanted.push((
            e.secret_ref.name.clone(),
            keys.map(String::from).into(),
            "objectStore",
        ));
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let mut secrets = Vec::new();
    for (name, keys, dependency) in wanted {
        let present = api.get_opt(&name).await?.map(|secret| {
            let data = secret.data.unwrap_or_default();
            let strings = secret.string_data.unwrap_or_default();
            data.into_keys().chain(strings.into_keys()).collect()
        });
        secrets.push(ExternalSecret {
            name,
            dependency,
            wanted: keys,
            present,
        });
    }
    Ok(secrets)
}
