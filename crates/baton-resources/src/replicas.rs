//! The agent replicas: StatefulSet (agent container + injected sidecar),
//! Services, ConfigMap, ServiceAccount and PodDisruptionBudget.

use std::collections::BTreeMap;

use baton_api::constants::{
    NON_ROOT_UID, TERMINATION_GRACE_MARGIN_SECONDS, annotations, env, mounts, paths, ports,
    secret_keys,
};
use baton_api::validate::{Dependency, format_duration};
use baton_api::{LedgerContent, ValidAgentDeployment};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, EmptyDirVolumeSource, HTTPGetAction, Lifecycle,
    LifecycleHandler, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Secret, Service,
    ServiceAccount, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use crate::credentials::Credentials;
use crate::meta::{App, label_selector, labels, object_meta, selector_labels};
use crate::parts::{
    container_security, env_from_field, env_from_secret, env_value, pod_security, secret_data,
    service_port,
};

const WORKSPACE_VOLUME: &str = "workspace";
const SIDECAR_TMP_VOLUME: &str = "baton-tmp";
const AGENT_CONTAINER: &str = "agent";
pub const SIDECAR_CONTAINER: &str = "baton";
const HTTP_PORT_NAME: &str = "http";
const ADMIN_PORT_NAME: &str = ports::SIDECAR_ADMIN_NAME;

/// The runtime settings every replica gets: the ConfigMap's data and the
/// sidecar's plain environment, from one list so they cannot drift apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig(pub BTreeMap<String, String>);

impl RuntimeConfig {
    pub fn new(agd: &ValidAgentDeployment) -> Self {
        let t = &agd.timings;
        let mut settings = BTreeMap::from([
            (env::DEPLOYMENT, agd.name.clone()),
            (
                env::STORE_NAMESPACE,
                format!(
                    "{}.{}",
                    agd.resource
                        .metadata
                        .namespace
                        .as_deref()
                        .unwrap_or("default"),
                    agd.name
                ),
            ),
            (env::LEASE_TTL, format_duration(t.lease_ttl)),
            (env::STATE_TTL, format_duration(t.state_ttl)),
            (env::RENEW_INTERVAL, format_duration(t.renew_interval)),
            (env::DRAIN_TIMEOUT, format_duration(t.drain_timeout)),
            (
                env::HEARTBEAT_INTERVAL,
                format_duration(t.heartbeat_interval),
            ),
            (
                env::AGENT_URL,
                format!("http://127.0.0.1:{}", agd.resource.spec.agent_port),
            ),
            (env::WORKSPACE_DIR, mounts::WORKSPACE.to_owned()),
            (env::WORKSPACE_CACHE_MIB, WORKSPACE_CACHE_MIB.to_string()),
            (env::LISTEN, format!("0.0.0.0:{}", ports::SIDECAR_HTTP)),
            (
                env::ADMIN_LISTEN,
                format!("0.0.0.0:{}", ports::SIDECAR_ADMIN),
            ),
        ]);
        // Only what differs from the sidecar's defaults (full text, kept
        // as long as the ledger), so that an operator upgrade that brought
        // these settings rolls no deployment that does not use them.
        let ledger = &agd.resource.spec.ledger;
        if ledger.content != LedgerContent::Full {
            settings.insert(env::LEDGER_CONTENT, ledger.content.as_str().to_owned());
        }
        if let Some(retention) = &ledger.retention {
            settings.insert(env::LEDGER_RETENTION, retention.clone());
        }
        let (bucket, path_style) = match &agd.object_store {
            Dependency::Managed(m) => (m.bucket.clone(), true),
            Dependency::External(e) => (e.bucket.clone(), e.force_path_style),
        };
        if agd.resource.spec.rollout.migrate_layout {
            settings.insert(env::ADOPT_LAYOUT, "true".to_owned());
        }
        settings.insert(env::S3_BUCKET, bucket);
        settings.insert(env::S3_FORCE_PATH_STYLE, path_style.to_string());
        Self(
            settings
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        )
    }

    fn env(&self) -> impl Iterator<Item = k8s_openapi::api::core::v1::EnvVar> + '_ {
        self.0.iter().map(|(k, v)| env_value(k, v.clone()))
    }
}

/// Hash of everything a running pod reads only at start: the runtime
/// settings and the managed credentials. Put on the pod template so that a
/// change makes a new revision for the rollout to replace.
pub fn config_hash(config: &RuntimeConfig, secret_digests: &[(String, Vec<u8>)]) -> String {
    let mut hasher = Sha256::new();
    for (k, v) in &config.0 {
        hasher.update(k.as_bytes());
        hasher.update([0]);
        hasher.update(v.as_bytes());
        hasher.update([0]);
    }
    for (name, digest) in secret_digests {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(digest);
    }
    let digest = hasher.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

pub fn config_map(agd: &ValidAgentDeployment, config: &RuntimeConfig) -> ConfigMap {
    ConfigMap {
        metadata: object_meta(agd, App::Agent, agd.names.config_map()),
        data: Some(config.0.clone()),
        ..ConfigMap::default()
    }
}

/// The admin token the operator drains and hands over replicas with; the
/// sidecars read it from here (`BATON_ADMIN_TOKENS`).
pub fn admin_secret(agd: &ValidAgentDeployment, creds: &Credentials) -> Secret {
    Secret {
        metadata: object_meta(agd, App::Agent, agd.names.admin_secret()),
        type_: Some("Opaque".into()),
        data: Some(secret_data([(
            secret_keys::TOKEN,
            creds.admin_token.clone(),
        )])),
        ..Secret::default()
    }
}

/// The ServiceAccount, unless the user brings their own.
pub fn service_account(agd: &ValidAgentDeployment) -> Option<ServiceAccount> {
    if agd.resource.spec.service_account_name.is_some() {
        return None;
    }
    Some(ServiceAccount {
        metadata: object_meta(agd, App::Agent, agd.names.replicas()),
        // The sidecar and the agent never call the Kubernetes API.
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    })
}

/// The client Service: what callers of the turn API talk to.
pub fn client_service(agd: &ValidAgentDeployment) -> Service {
    Service {
        metadata: object_meta(agd, App::Agent, agd.names.replicas()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels(agd, App::Agent)),
            ports: Some(vec![service_port(
                HTTP_PORT_NAME,
                ports::CLIENT_SERVICE,
                HTTP_PORT_NAME,
            )]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The headless Service: a stable DNS name per replica, draining ones included
/// (the operator and the dashboard must reach a replica that is not ready).
pub fn headless_service(agd: &ValidAgentDeployment) -> Service {
    Service {
        metadata: object_meta(agd, App::Agent, agd.names.headless_service()),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(agd, App::Agent)),
            ports: Some(vec![
                service_port(HTTP_PORT_NAME, ports::SIDECAR_HTTP, HTTP_PORT_NAME),
                service_port(ADMIN_PORT_NAME, ports::SIDECAR_ADMIN, ADMIN_PORT_NAME),
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

pub fn pod_disruption_budget(agd: &ValidAgentDeployment) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: object_meta(agd, App::Agent, agd.names.replicas()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(label_selector(agd, App::Agent)),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

fn http_get(path: &str) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.to_owned()),
        port: IntOrString::Int(i32::from(ports::SIDECAR_HTTP)),
        scheme: Some("HTTP".into()),
        ..HTTPGetAction::default()
    }
}

fn http_probe(path: &str, period_seconds: i32, failure_threshold: i32) -> Probe {
    Probe {
        http_get: Some(http_get(path)),
        period_seconds: Some(period_seconds),
        failure_threshold: Some(failure_threshold),
        timeout_seconds: Some(1),
        ..Probe::default()
    }
}

/// The agent container blocks in preStop until the sidecar has drained:
/// the kubelet sends the agent SIGTERM only after the hook returns, so the
/// agent keeps serving the turns the sidecar is finishing. The sidecar
/// itself has no hook: the SIGTERM the kubelet sends it at once starts its
/// drain, and it exits once drained. The hook only waits (see
/// [`paths::DRAINED`]): nothing reachable over the network starts a drain
/// without an admin token.
fn wait_for_the_sidecars_drain() -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            http_get: Some(http_get(paths::DRAINED)),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

fn workspace_mount() -> VolumeMount {
    VolumeMount {
        name: WORKSPACE_VOLUME.into(),
        mount_path: mounts::WORKSPACE.into(),
        ..VolumeMount::default()
    }
}

fn default_sidecar_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), Quantity("50m".into())),
            ("memory".into(), Quantity("64Mi".into())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".into(),
            Quantity("256Mi".into()),
        )])),
        ..ResourceRequirements::default()
    }
}

fn agent_container(agd: &ValidAgentDeployment) -> Container {
    let spec = &agd.resource.spec;
    let mut container_env = vec![
        env_value(env::AGENT_PORT, spec.agent_port.to_string()),
        env_value(env::WORKSPACE_DIR, mounts::WORKSPACE),
    ];
    container_env.extend(spec.env.iter().cloned());
    Container {
        name: AGENT_CONTAINER.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_owned()),
        ports: Some(vec![ContainerPort {
            name: Some(AGENT_CONTAINER.into()),
            container_port: spec.agent_port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        env: Some(container_env),
        resources: spec.resources.clone(),
        volume_mounts: Some(vec![workspace_mount()]),
        lifecycle: Some(wait_for_the_sidecars_drain()),
        security_context: Some(container_security(false)),
        ..Container::default()
    }
}

fn sidecar_container(agd: &ValidAgentDeployment, config: &RuntimeConfig) -> Container {
    let mut sidecar_env = vec![
        env_from_field(env::REPLICA_ID, "metadata.name"),
        env_from_field(env::POD_NAMESPACE, "metadata.namespace"),
        env_from_field(env::POD_IP, "status.podIP"),
        env_from_secret(
            env::ADMIN_TOKENS,
            &agd.names.admin_secret(),
            secret_keys::TOKEN,
            false,
        ),
        // Kubernetes expands `$(VAR)` from the variables listed before it.
        k8s_openapi::api::core::v1::EnvVar {
            name: env::ADVERTISE_URL.into(),
            value: Some(format!(
                "http://$({}):{}",
                env::POD_IP,
                ports::SIDECAR_ADMIN
            )),
            ..Default::default()
        },
    ];
    sidecar_env.extend(config.env());
    sidecar_env.extend(crate::stores::sidecar_env(agd));
    Container {
        name: SIDECAR_CONTAINER.into(),
        image: Some(agd.sidecar_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(vec!["sidecar".into()]),
        ports: Some(vec![
            ContainerPort {
                name: Some(HTTP_PORT_NAME.into()),
                container_port: i32::from(ports::SIDECAR_HTTP),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some(ADMIN_PORT_NAME.into()),
                container_port: i32::from(ports::SIDECAR_ADMIN),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
        env: Some(sidecar_env),
        resources: Some(
            agd.resource
                .spec
                .sidecar
                .resources
                .clone()
                .unwrap_or_else(default_sidecar_resources),
        ),
        startup_probe: Some(http_probe(paths::HEALTHZ, 1, 60)),
        readiness_probe: Some(http_probe(paths::READYZ, 2, 1)),
        liveness_probe: Some(http_probe(paths::HEALTHZ, 10, 3)),
        volume_mounts: Some(vec![
            workspace_mount(),
            VolumeMount {
                name: SIDECAR_TMP_VOLUME.into(),
                mount_path: mounts::SIDECAR_TMP.into(),
                ..VolumeMount::default()
            },
        ]),
        security_context: Some(container_security(true)),
        ..Container::default()
    }
}

/// The session workspaces' volume: the turns running now and the
/// directories the sidecar keeps between turns, which it bounds to
/// [`WORKSPACE_CACHE_MIB`], well below this; the kubelet evicts a pod
/// whose emptyDir outgrows its limit.
const WORKSPACE_SIZE_LIMIT: &str = "10Gi";
/// What the sidecar keeps of idle session directories (MiB).
const WORKSPACE_CACHE_MIB: u64 = 4096;

fn empty_dir(name: &str, size_limit: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: size_limit.map(|s| Quantity(s.into())),
            medium: None,
        }),
        ..Volume::default()
    }
}

/// The replica StatefulSet. `OnDelete`: the operator replaces pods itself,
/// one by one with drain and takeover, so a release loses no turn.
pub fn stateful_set(agd: &ValidAgentDeployment, config_hash: &str) -> StatefulSet {
    let spec = &agd.resource.spec;
    let config = RuntimeConfig::new(agd);

    let mut pod_labels = spec.pod_labels.clone();
    pod_labels.extend(labels(agd, App::Agent));
    let mut pod_annotations = spec.pod_annotations.clone();
    pod_annotations.insert(annotations::CONFIG_HASH.into(), config_hash.to_owned());

    let grace =
        agd.timings.drain_timeout.as_secs_f64().ceil() as i64 + TERMINATION_GRACE_MARGIN_SECONDS;
    let own_service_account = spec.service_account_name.is_none();

    StatefulSet {
        metadata: object_meta(agd, App::Agent, agd.names.replicas()),
        spec: Some(StatefulSetSpec {
            replicas: Some(spec.replicas),
            service_name: Some(agd.names.headless_service()),
            selector: label_selector(agd, App::Agent),
            pod_management_policy: Some("Parallel".into()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                rolling_update: None,
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(
                        spec.service_account_name
                            .clone()
                            .unwrap_or_else(|| agd.names.replicas()),
                    ),
                    automount_service_account_token: own_service_account.then_some(false),
                    termination_grace_period_seconds: Some(grace),
                    security_context: Some(pod_security(NON_ROOT_UID)),
                    node_selector: (!spec.node_selector.is_empty())
                        .then(|| spec.node_selector.clone()),
                    tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
                    containers: vec![agent_container(agd), sidecar_container(agd, &config)],
                    volumes: Some(vec![
                        empty_dir(WORKSPACE_VOLUME, Some(WORKSPACE_SIZE_LIMIT)),
                        empty_dir(SIDECAR_TMP_VOLUME, Some("64Mi")),
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}
