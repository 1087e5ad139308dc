//! The three stores: managed ones as single-instance StatefulSets on PVCs
//! with a Secret each, external ones only as Secret references wired into
//! the sidecar.
//!
//! Every store Secret, managed or external, has the same keys (`url` for
//! Redis and Postgres; `endpoint`, `accessKeyId`, `secretAccessKey`,
//! `region` for the object store), so the sidecar's wiring is one code path.

use baton_api::constants::{DATASTORE_UID, env, images, ports, secret_keys};
use baton_api::validate::{DEFAULT_STORAGE, Dependency};
use baton_api::{ManagedStore, ValidAgentDeployment};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, ExecAction, HTTPGetAction, PodSpec,
    PodTemplateSpec, Probe, Secret, Service, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::credentials::Credentials;
use crate::meta::{App, label_selector, labels, object_meta, selector_labels};
use crate::parts::{
    container_security, data_volume_claim, env_from_secret, env_value, pod_security, secret_data,
    service_port, tcp_probe,
};

/// MinIO's image runs as this user when not root.
const MINIO_UID: i64 = 1000;
const POSTGRES_USER: &str = "baton";
const POSTGRES_DATABASE: &str = "baton";
const DEFAULT_REGION: &str = "us-east-1";

/// The sidecar's store environment: every URL and credential from a Secret.
pub fn sidecar_env(agd: &ValidAgentDeployment) -> Vec<EnvVar> {
    let (redis_secret, redis_key) = match &agd.redis {
        Dependency::Managed(_) => (agd.names.redis(), secret_keys::URL.to_owned()),
        Dependency::External(e) => (e.secret_ref.name.clone(), e.secret_ref.url_key.clone()),
    };
    let (postgres_secret, postgres_key) = match &agd.postgres {
        Dependency::Managed(_) => (agd.names.postgres(), secret_keys::URL.to_owned()),
        Dependency::External(e) => (e.secret_ref.name.clone(), e.secret_ref.url_key.clone()),
    };
    let s3_secret = match &agd.object_store {
        Dependency::Managed(_) => agd.names.minio(),
        Dependency::External(e) => e.secret_ref.name.clone(),
    };
    let mut vars = vec![
        env_from_secret(env::REDIS_URL, &redis_secret, &redis_key, false),
        env_from_secret(env::DATABASE_URL, &postgres_secret, &postgres_key, false),
    ];
    vars.extend(object_store_env(&s3_secret));
    vars
}

fn object_store_env(secret: &str) -> Vec<EnvVar> {
    vec![
        env_from_secret(env::S3_ENDPOINT, secret, secret_keys::ENDPOINT, false),
        env_from_secret(env::S3_REGION, secret, secret_keys::REGION, true),
        env_from_secret(
            env::S3_ACCESS_KEY_ID,
            secret,
            secret_keys::ACCESS_KEY_ID,
            false,
        ),
        env_from_secret(
            env::S3_SECRET_ACCESS_KEY,
            secret,
            secret_keys::SECRET_ACCESS_KEY,
            false,
        ),
    ]
}

/// The objects of one managed store.
pub struct ManagedObjects {
    pub secret: Secret,
    pub service: Service,
    pub stateful_set: StatefulSet,
}

fn secret(
    agd: &ValidAgentDeployment,
    app: App,
    name: String,
    pairs: Vec<(&str, String)>,
) -> Secret {
    Secret {
        metadata: object_meta(agd, app, name),
        type_: Some("Opaque".into()),
        data: Some(secret_data(pairs)),
        ..Secret::default()
    }
}

fn service(
    agd: &ValidAgentDeployment,
    app: App,
    name: String,
    port_name: &str,
    port: u16,
) -> Service {
    Service {
        metadata: object_meta(agd, app, name),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels(agd, app)),
            ports: Some(vec![service_port(port_name, port, port_name)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Parts of a store's pod that differ between Redis, Postgres and MinIO.
struct StorePod {
    app: App,
    name: String,
    image: String,
    args: Vec<String>,
    env: Vec<EnvVar>,
    port_name: &'static str,
    port: u16,
    data_path: &'static str,
    readiness: Probe,
    liveness: Probe,
    uid: i64,
}

fn store_stateful_set(
    agd: &ValidAgentDeployment,
    store: &ManagedStore,
    pod: StorePod,
) -> StatefulSet {
    let size = store
        .storage
        .clone()
        .unwrap_or_else(|| Quantity(DEFAULT_STORAGE.into()));
    StatefulSet {
        metadata: object_meta(agd, pod.app, pod.name.clone()),
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(pod.name),
            selector: label_selector(agd, pod.app),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(agd, pod.app)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(false),
                    security_context: Some(pod_security(pod.uid)),
                    containers: vec![Container {
                        name: pod.app.name().into(),
                        image: Some(pod.image),
                        image_pull_policy: Some("IfNotPresent".into()),
                        args: (!pod.args.is_empty()).then_some(pod.args),
                        env: Some(pod.env),
                        ports: Some(vec![ContainerPort {
                            name: Some(pod.port_name.into()),
                            container_port: i32::from(pod.port),
                            protocol: Some("TCP".into()),
                            ..ContainerPort::default()
                        }]),
                        readiness_probe: Some(pod.readiness),
                        startup_probe: Some(startup_probe(&pod.liveness)),
                        liveness_probe: Some(pod.liveness),
                        resources: store.resources.clone(),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "data".into(),
                            mount_path: pod.data_path.into(),
                            ..VolumeMount::default()
                        }]),
                        security_context: Some(container_security(false)),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            volume_claim_templates: Some(vec![data_volume_claim(
                &size,
                store.storage_class_name.as_ref(),
            )]),
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

/// Managed Redis with AOF persistence (`appendfsync everysec`): a restart
/// loses at most about a second of coordination state, and the ledger
/// covers the rest (G7).
pub fn redis(agd: &ValidAgentDeployment, creds: &Credentials) -> Option<ManagedObjects> {
    let Dependency::Managed(m) = &agd.redis else {
        return None;
    };
    let name = agd.names.redis();
    let (url, mut pairs) = if m.auth {
        let pw = &creds.redis_password;
        (
            format!("redis://:{pw}@{name}:{}/0", ports::REDIS),
            vec![(secret_keys::PASSWORD, pw.clone())],
        )
    } else {
        (format!("redis://{name}:{}/0", ports::REDIS), vec![])
    };
    pairs.push((secret_keys::URL, url));

    let mut args: Vec<String> = [
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--dir",
        "/data",
    ]
    .map(String::from)
    .into();
    let mut pod_env = vec![];
    if m.auth {
        pod_env.push(env_from_secret(
            "REDIS_PASSWORD",
            &name,
            secret_keys::PASSWORD,
            false,
        ));
        args.extend(["--requirepass".into(), "$(REDIS_PASSWORD)".into()]);
    } else {
        args.extend(["--protected-mode".into(), "no".into()]);
    }
    let pod = StorePod {
        app: App::Redis,
        name: name.clone(),
        image: m
            .store
            .image
            .clone()
            .unwrap_or_else(|| images::REDIS.into()),
        args,
        env: pod_env,
        port_name: "redis",
        port: ports::REDIS,
        data_path: "/data",
        readiness: tcp_probe(ports::REDIS, 2),
        liveness: tcp_probe(ports::REDIS, 10),
        uid: DATASTORE_UID,
    };
    Some(ManagedObjects {
        secret: secret(agd, App::Redis, name.clone(), pairs),
        service: service(agd, App::Redis, name, "redis", ports::REDIS),
        stateful_set: store_stateful_set(agd, &m.store, pod),
    })
}

/// Managed Postgres for the turn ledger.
pub fn postgres(agd: &ValidAgentDeployment, creds: &Credentials) -> Option<ManagedObjects> {
    let Dependency::Managed(m) = &agd.postgres else {
        return None;
    };
    let name = agd.names.postgres();
    let pw = &creds.postgres_password;
    let pairs = vec![
        (secret_keys::USERNAME, POSTGRES_USER.to_owned()),
        (secret_keys::PASSWORD, pw.clone()),
        (secret_keys::DATABASE, POSTGRES_DATABASE.to_owned()),
        (
            secret_keys::URL,
            format!(
                "postgres://{POSTGRES_USER}:{pw}@{name}:{}/{POSTGRES_DATABASE}",
                ports::POSTGRES
            ),
        ),
    ];
    let is_ready = Probe {
        exec: Some(ExecAction {
            command: Some(
                [
                    "pg_isready",
                    "-h",
                    "127.0.0.1",
                    "-U",
                    POSTGRES_USER,
                    "-d",
                    POSTGRES_DATABASE,
                ]
                .map(String::from)
                .into(),
            ),
        }),
        period_seconds: Some(2),
        ..Probe::default()
    };
    let pod = StorePod {
        app: App::Postgres,
        name: name.clone(),
        image: m.image.clone().unwrap_or_else(|| images::POSTGRES.into()),
        args: vec![],
        env: vec![
            env_from_secret("POSTGRES_USER", &name, secret_keys::USERNAME, false),
            env_from_secret("POSTGRES_PASSWORD", &name, secret_keys::PASSWORD, false),
            env_from_secret("POSTGRES_DB", &name, secret_keys::DATABASE, false),
            // A subdirectory: the volume's root may hold lost+found.
            env_value("PGDATA", "/var/lib/postgresql/data/pgdata"),
        ],
        port_name: "postgres",
        port: ports::POSTGRES,
        data_path: "/var/lib/postgresql/data",
        readiness: is_ready,
        liveness: tcp_probe(ports::POSTGRES, 10),
        uid: DATASTORE_UID,
    };
    Some(ManagedObjects {
        secret: secret(agd, App::Postgres, name.clone(), pairs),
        service: service(agd, App::Postgres, name, "postgres", ports::POSTGRES),
        stateful_set: store_stateful_set(agd, m, pod),
    })
}

/// The liveness check, asked every 2 s for up to 5 minutes until it first
/// passes: a store that starts slowly (a loaded node, a long recovery) is
/// not killed by its liveness probe before it ever served, and then killed
/// again after every restart.
fn startup_probe(liveness: &Probe) -> Probe {
    Probe {
        period_seconds: Some(2),
        failure_threshold: Some(150),
        ..liveness.clone()
    }
}

fn minio_health(path: &str, period_seconds: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(ports::MINIO)),
            scheme: Some("HTTP".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        ..Probe::default()
    }
}

/// Managed MinIO and the Job that creates the bucket.
pub fn minio(agd: &ValidAgentDeployment, creds: &Credentials) -> Option<(ManagedObjects, Job)> {
    let Dependency::Managed(m) = &agd.object_store else {
        return None;
    };
    let name = agd.names.minio();
    let pairs = vec![
        (
            secret_keys::ENDPOINT,
            format!("http://{name}:{}", ports::MINIO),
        ),
        (secret_keys::REGION, DEFAULT_REGION.to_owned()),
        (
            secret_keys::ACCESS_KEY_ID,
            creds.object_store_access_key_id.clone(),
        ),
        (
            secret_keys::SECRET_ACCESS_KEY,
            creds.object_store_secret_access_key.clone(),
        ),
    ];
    let pod = StorePod {
        app: App::Minio,
        name: name.clone(),
        image: m
            .store
            .image
            .clone()
            .unwrap_or_else(|| images::MINIO.into()),
        args: ["server", "/data", "--address"]
            .map(String::from)
            .into_iter()
            .chain([format!(":{}", ports::MINIO)])
            .collect(),
        env: vec![
            env_from_secret("MINIO_ROOT_USER", &name, secret_keys::ACCESS_KEY_ID, false),
            env_from_secret(
                "MINIO_ROOT_PASSWORD",
                &name,
                secret_keys::SECRET_ACCESS_KEY,
                false,
            ),
        ],
        port_name: "s3",
        port: ports::MINIO,
        data_path: "/data",
        readiness: minio_health("/minio/health/ready", 2),
        liveness: minio_health("/minio/health/live", 10),
        uid: MINIO_UID,
    };
    let objects = ManagedObjects {
        secret: secret(agd, App::Minio, name.clone(), pairs),
        service: service(agd, App::Minio, name.clone(), "s3", ports::MINIO),
        stateful_set: store_stateful_set(agd, &m.store, pod),
    };
    Some((objects, bucket_job(agd, &name, &m.bucket)))
}

/// Creates the bucket once MinIO answers; retried by the Job until it does.
fn bucket_job(agd: &ValidAgentDeployment, minio_secret: &str, bucket: &str) -> Job {
    let mut job_env = object_store_env(minio_secret);
    job_env.push(env_value(env::S3_BUCKET, bucket));
    job_env.push(env_value("MC_CONFIG_DIR", "/tmp/.mc"));
    let script = format!(
        "mc alias set baton \"${}\" \"${}\" \"${}\" && mc mb --ignore-existing \"baton/${}\"",
        env::S3_ENDPOINT,
        env::S3_ACCESS_KEY_ID,
        env::S3_SECRET_ACCESS_KEY,
        env::S3_BUCKET
    );
    Job {
        metadata: object_meta(agd, App::BucketInit, agd.names.bucket_job()),
        spec: Some(JobSpec {
            backoff_limit: Some(20),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(agd, App::BucketInit)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("OnFailure".into()),
                    automount_service_account_token: Some(false),
                    security_context: Some(pod_security(MINIO_UID)),
                    containers: vec![Container {
                        name: "create-bucket".into(),
                        image: Some(images::MINIO_CLIENT.into()),
                        image_pull_policy: Some("IfNotPresent".into()),
                        command: Some(vec!["/bin/sh".into(), "-c".into(), script]),
                        env: Some(job_env),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "tmp".into(),
                            mount_path: "/tmp".into(),
                            ..VolumeMount::default()
                        }]),
                        security_context: Some(container_security(true)),
                        ..Container::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "tmp".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Volume::default()
                    }]),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}
