//! Names every Baton component agrees on: label keys, annotation keys, ports,
//! environment variables and default images. Nothing here does I/O.

/// The API group of Baton's custom resources.
pub const GROUP: &str = "baton.dev";
/// The only served version so far.
pub const VERSION: &str = "v1alpha1";
/// Field manager used for every server-side apply Baton makes.
pub const FIELD_MANAGER: &str = "baton-operator";

/// Standard Kubernetes recommended labels.
pub mod labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const PART_OF: &str = "app.kubernetes.io/part-of";

    /// Value of `app.kubernetes.io/part-of` on every object Baton creates.
    pub const PART_OF_VALUE: &str = "baton";
    /// Value of `app.kubernetes.io/managed-by` on every object Baton creates.
    pub const MANAGED_BY_VALUE: &str = "baton-operator";

    /// Label keys users may not set through `spec.podLabels`: the selectors
    /// and ownership depend on them.
    pub const RESERVED: [&str; 5] = [NAME, INSTANCE, COMPONENT, MANAGED_BY, PART_OF];
}

/// Annotation keys.
pub mod annotations {
    /// Hash of the runtime configuration on the replica pod template, so a
    /// configuration change produces a new revision that the rollout replaces.
    pub const CONFIG_HASH: &str = "baton.dev/config-hash";
    /// Hash of the object the operator last applied to a child (computed
    /// before this annotation is added): an unchanged desired object is not
    /// applied again, so a resync writes nothing.
    pub const APPLIED_HASH: &str = "baton.dev/applied-hash";
    /// On the pod template, from `spec.podAnnotations`: `baton rollout
    /// restart` sets it to the time, a new revision the rollout replaces.
    pub const RESTARTED_AT: &str = "baton.dev/restarted-at";
    /// On a replica pod: the data layout of its sidecar (what the rollout
    /// compares before replacing the others), read from the sidecar.
    pub const LAYOUT: &str = "baton.dev/layout";
    /// On a ServiceAccount, `"true"`: an `AgentDeployment` in its namespace
    /// may run its pods under it (`spec.serviceAccountName`). Whoever may
    /// give pods that account says so; without it, anyone who may create
    /// an `AgentDeployment` could run code under any account of the
    /// namespace through the operator.
    pub const AGENT_SERVICE_ACCOUNT: &str = "baton.dev/agent-service-account";
    /// Prefix reserved for Baton's own annotations.
    pub const RESERVED_PREFIX: &str = "baton.dev/";
}

/// Ports.
pub mod ports {
    /// The sidecar's HTTP port: turn API, probes and metrics.
    pub const SIDECAR_HTTP: u16 = 7070;
    /// The sidecar's admin API (drain, status, handover, takeover) on
    /// Kubernetes: a port of its own, which the deployment's NetworkPolicy
    /// opens to the operator and the dashboard only.
    pub const SIDECAR_ADMIN: u16 = 7071;
    /// The admin port's name on the container and the headless Service,
    /// by which the dashboard finds it in the Service's EndpointSlices.
    pub const SIDECAR_ADMIN_NAME: &str = "admin";
    /// Port of the client Service in front of the replicas.
    pub const CLIENT_SERVICE: u16 = 80;
    pub const REDIS: u16 = 6379;
    pub const POSTGRES: u16 = 5432;
    pub const MINIO: u16 = 9000;
    /// Default port the user's agent container listens on.
    pub const DEFAULT_AGENT: u16 = 8080;
}

/// HTTP paths of the sidecar used by probes and hooks.
pub mod paths {
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    /// Answers once this replica has drained: waits for a drain to start
    /// (SIGTERM, or an operator's `POST` to [`DRAIN`]) and for its turns to
    /// end. Changes nothing, so it needs no token: the agent container's
    /// preStop hook (an httpGet, which cannot carry a secret) waits on it so
    /// the agent keeps serving the turns the sidecar is finishing.
    pub const DRAINED: &str = "/drained";
    /// Starts a drain (`?wait=true`: and waits for it).
    pub const DRAIN: &str = "/v1/admin/drain";
    /// What the replica runs: draining, turns in flight, layout.
    pub const STATUS: &str = "/v1/admin/status";
    /// After a drain: releases every lease the replica still holds.
    pub const HANDOVER: &str = "/v1/admin/handover";
}

/// Headers of the sidecar's admin API.
pub mod headers {
    /// Who an admin call acts for (`alice (dashboard)`, `operator`): the
    /// admin token says the caller may act, this says on whose behalf, so
    /// the sidecar's log of a drain or takeover names a person.
    pub const ACTOR: &str = "x-baton-actor";

    /// `name` as an [`ACTOR`] header value: printable ASCII only (a header
    /// carries no other), anything else as `?`, at most 128 characters.
    pub fn actor_value(name: &str) -> String {
        name.chars()
            .take(128)
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect()
    }
}

/// Environment variables injected into the pods.
pub mod env {
    pub const REPLICA_ID: &str = "BATON_REPLICA_ID";
    pub const POD_NAMESPACE: &str = "BATON_POD_NAMESPACE";
    /// The pod's IP (downward API), for [`ADVERTISE_URL`].
    pub const POD_IP: &str = "BATON_POD_IP";
    /// Set (`true`) for `spec.rollout.migrateLayout`: the sidecar may take
    /// over stores that hold another data layout.
    pub const ADOPT_LAYOUT: &str = "BATON_ADOPT_LAYOUT";
    /// The admin token the operator calls the sidecars' admin API with.
    pub const ADMIN_TOKENS: &str = "BATON_ADMIN_TOKENS";
    /// Where the sidecar's API answers others (the dashboard), said with
    /// its heartbeats.
    pub const ADVERTISE_URL: &str = "BATON_ADVERTISE_URL";
    pub const DEPLOYMENT: &str = "BATON_DEPLOYMENT";
    /// `<namespace>.<name>` of the AgentDeployment: every Redis key, ledger
    /// table and object of its replicas lives under it, so deployments that
    /// share external stores never meet.
    pub const STORE_NAMESPACE: &str = "BATON_STORE_NAMESPACE";
    pub const LEASE_TTL: &str = "BATON_LEASE_TTL";
    /// What the ledger keeps of a turn: `full` or `digest`.
    pub const LEDGER_CONTENT: &str = "BATON_LEDGER_CONTENT";
    /// How long the ledger keeps turn records (`30d`, `720h`); unset: always.
    pub const LEDGER_RETENTION: &str = "BATON_LEDGER_RETENTION";
    pub const STATE_TTL: &str = "BATON_STATE_TTL";
    pub const RENEW_INTERVAL: &str = "BATON_RENEW_INTERVAL";
    pub const DRAIN_TIMEOUT: &str = "BATON_DRAIN_TIMEOUT";
    pub const HEARTBEAT_INTERVAL: &str = "BATON_HEARTBEAT_INTERVAL";
    pub const AGENT_URL: &str = "BATON_AGENT_URL";
    pub const AGENT_PORT: &str = "BATON_AGENT_PORT";
    pub const WORKSPACE_DIR: &str = "BATON_WORKSPACE_DIR";
    /// How much of idle session directories a sidecar keeps (MiB).
    pub const WORKSPACE_CACHE_MIB: &str = "BATON_WORKSPACE_CACHE_MIB";
    /// How often one replica deletes the workspace objects no session uses.
    pub const WORKSPACE_GC_INTERVAL: &str = "BATON_WORKSPACE_GC_INTERVAL";
    /// Workspace objects younger than this are never deleted.
    pub const WORKSPACE_GC_RETENTION: &str = "BATON_WORKSPACE_GC_RETENTION";
    pub const LISTEN: &str = "BATON_LISTEN";
    pub const ADMIN_LISTEN: &str = "BATON_ADMIN_LISTEN";
    pub const REDIS_URL: &str = "BATON_REDIS_URL";
    pub const DATABASE_URL: &str = "BATON_DATABASE_URL";
    pub const S3_ENDPOINT: &str = "BATON_S3_ENDPOINT";
    pub const S3_BUCKET: &str = "BATON_S3_BUCKET";
    pub const S3_REGION: &str = "BATON_S3_REGION";
    pub const S3_ACCESS_KEY_ID: &str = "BATON_S3_ACCESS_KEY_ID";
    pub const S3_SECRET_ACCESS_KEY: &str = "BATON_S3_SECRET_ACCESS_KEY";
    pub const S3_FORCE_PATH_STYLE: &str = "BATON_S3_FORCE_PATH_STYLE";

    /// Prefix of every variable Baton injects; user `env` may not use it.
    pub const RESERVED_PREFIX: &str = "BATON_";
}

/// Keys Baton reads from dependency Secrets (its own and external ones).
pub mod secret_keys {
    /// Redis or Postgres connection URL, credentials included.
    pub const URL: &str = "url";
    pub const PASSWORD: &str = "password";
    pub const USERNAME: &str = "username";
    pub const DATABASE: &str = "database";
    pub const ENDPOINT: &str = "endpoint";
    pub const REGION: &str = "region";
    pub const ACCESS_KEY_ID: &str = "accessKeyId";
    pub const SECRET_ACCESS_KEY: &str = "secretAccessKey";
    /// The admin token in the deployment's admin Secret.
    pub const TOKEN: &str = "token";
}

/// Default images. Pinned tags so a render is reproducible.
pub mod images {
    pub const SIDECAR: &str = concat!("ghcr.io/baton-dev/baton:", env!("CARGO_PKG_VERSION"));
    pub const REDIS: &str = "redis:7.2.5";
    pub const POSTGRES: &str = "postgres:16.4";
    pub const MINIO: &str = "minio/minio:RELEASE.2024-08-17T01-24-54Z";
    pub const MINIO_CLIENT: &str = "minio/mc:RELEASE.2024-08-17T11-33-50Z";
}

/// Mount paths inside the replica pods.
pub mod mounts {
    pub const WORKSPACE: &str = "/workspace";
    pub const SIDECAR_TMP: &str = "/tmp";
}

/// User id the sidecar and the pod run as (the distroless "nonroot" user).
pub const NON_ROOT_UID: i64 = 65532;
/// User id of the official Redis and Postgres images.
pub const DATASTORE_UID: i64 = 999;
/// Extra grace on top of the drain timeout before the kubelet kills a pod.
pub const TERMINATION_GRACE_MARGIN_SECONDS: i64 = 15;
