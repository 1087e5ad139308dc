//! The `AgentDeployment` custom resource (`baton.dev/v1alpha1`).
//!
//! Durations are kept as strings in the types (Kubernetes style: `30s`,
//! `1m30s`, `24h`) and parsed by [`crate::validate`], so that one bad field
//! does not hide the other violations behind a deserialisation error.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Go-style duration: one or more `<number><unit>` with units ns, us, ms, s, m, h.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
/// RFC 1123 DNS subdomain (names of Secrets, ServiceAccounts, StorageClasses).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A key of a Secret's data.
pub const SECRET_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";
/// An S3 bucket name (the subset every S3 implementation accepts).
pub const BUCKET_PATTERN: &str = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$";
/// A container image reference: no whitespace, no control characters.
pub const IMAGE_PATTERN: &str = r"^[^\s]+$";
/// Upper bound on `spec.replicas`.
pub const MAX_REPLICAS: i32 = 1000;

/// Runs a stateful AI agent as a set of replicas that share sessions through
/// Baton's turn protocol.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "baton.dev",
    version = "v1alpha1",
    kind = "AgentDeployment",
    plural = "agentdeployments",
    singular = "agentdeployment",
    shortname = "agd",
    category = "baton",
    namespaced,
    derive = "PartialEq",
    status = "AgentDeploymentStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Rollout","type":"string","jsonPath":".status.rollout.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AgentDeploymentSpec {
    /// The agent container image (the user's own, any language).
    #[schemars(length(min = 1, max = 4096), pattern(IMAGE_PATTERN))]
    pub image: String,

    /// Number of replicas. Every replica can serve every session.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// Port the agent container listens on for `POST /v1/turn`.
    #[serde(default = "default_agent_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub agent_port: i32,

    /// Extra environment for the agent container. Names starting with
    /// `BATON_` are reserved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,

    /// Resources of the agent container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Run the pods under this existing ServiceAccount instead of one Baton
    /// creates. It must carry the annotation
    /// `baton.dev/agent-service-account: "true"` (set by whoever may give
    /// pods that account); until it does, the deployment is InvalidSpec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub service_account_name: Option<String>,

    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// Extra labels on the replica pods (`app.kubernetes.io/*` are reserved).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,

    /// Extra annotations on the replica pods (`baton.dev/*` are reserved).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,

    #[serde(default)]
    pub session: SessionSpec,

    #[serde(default)]
    pub dependencies: DependenciesSpec,

    #[serde(default)]
    pub sidecar: SidecarSpec,

    #[serde(default)]
    pub rollout: RolloutSpec,

    #[serde(default)]
    pub ledger: LedgerSpec,
}

/// `spec.ledger.retention`: a duration, or a number of days (`30d`).
pub const RETENTION_PATTERN: &str = r"^([1-9][0-9]{0,4}d|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$";

/// What the turn ledger keeps of each turn, and for how long.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.retention) || (self.retention.endsWith('d') ? !self.retention.startsWith('0') : duration(self.retention) >= duration('1h'))").message("retention must be at least 1h").field_path(".retention")
)]
pub struct LedgerSpec {
    /// `full` (the default): each turn's input and reply, beside their
    /// SHA-256 digests, so the dashboard shows what was said; `digest`:
    /// the digests alone.
    #[serde(default)]
    pub content: LedgerContent,

    /// How long turn records are kept after their commit: a duration
    /// (`720h`) or days (`30d`), at least 1h. Unset: as long as the ledger
    /// exists. A replica deletes older records every 10 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(RETENTION_PATTERN))]
    pub retention: Option<String>,
}

/// What the ledger keeps of a turn's words.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LedgerContent {
    #[default]
    Full,
    Digest,
}

impl LedgerContent {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Digest => "digest",
        }
    }
}

impl std::str::FromStr for LedgerContent {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "full" => Ok(Self::Full),
            "digest" => Ok(Self::Digest),
            other => Err(format!("{other:?} is not one of full, digest")),
        }
    }
}

fn default_replicas() -> i32 {
    2
}

fn default_agent_port() -> i32 {
    i32::from(crate::constants::ports::DEFAULT_AGENT)
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ImagePullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Timing of the turn protocol. All durations are Kubernetes-style strings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("duration(self.leaseTtl) >= duration('2s') && duration(self.leaseTtl) <= duration('1h')").message("leaseTtl must be between 2s and 1h").field_path(".leaseTtl"),
    validation = Rule::new("duration(self.stateTtl) >= duration(self.leaseTtl) && duration(self.stateTtl) <= duration('8784h')").message("stateTtl must be at least leaseTtl and at most 8784h").field_path(".stateTtl"),
    validation = Rule::new("!has(self.renewInterval) || (duration(self.renewInterval) > duration('0s') && duration(self.renewInterval) < duration(self.leaseTtl))").message("renewInterval must be greater than 0 and shorter than leaseTtl").field_path(".renewInterval"),
    validation = Rule::new("duration(self.drainTimeout) >= duration('1s') && duration(self.drainTimeout) <= duration('1h')").message("drainTimeout must be between 1s and 1h").field_path(".drainTimeout"),
    validation = Rule::new("duration(self.heartbeatInterval) >= duration('50ms') && duration(self.heartbeatInterval) < duration(self.leaseTtl)").message("heartbeatInterval must be at least 50ms and shorter than leaseTtl").field_path(".heartbeatInterval")
)]
pub struct SessionSpec {
    /// How long a turn's lease lasts without renewal (at least 2s).
    #[serde(default = "default_lease_ttl")]
    #[schemars(length(max = 64), pattern(DURATION_PATTERN))]
    pub lease_ttl: String,

    /// How long an idle session's state is kept in the coordination store.
    #[serde(default = "default_state_ttl")]
    #[schemars(length(max = 64), pattern(DURATION_PATTERN))]
    pub state_ttl: String,

    /// How often a running turn renews its lease. Defaults to leaseTtl/3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(DURATION_PATTERN))]
    pub renew_interval: Option<String>,

    /// How long a draining replica waits for in-flight turns before it
    /// aborts them so another replica can take over.
    #[serde(default = "default_drain_timeout")]
    #[schemars(length(max = 64), pattern(DURATION_PATTERN))]
    pub drain_timeout: String,

    /// How often a replica refreshes its liveness key; a lease whose owner
    /// stopped heartbeating is free after a few missed beats.
    #[serde(default = "default_heartbeat_interval")]
    #[schemars(length(max = 64), pattern(DURATION_PATTERN))]
    pub heartbeat_interval: String,
}

impl Default for SessionSpec {
    fn default() -> Self {
        Self {
            lease_ttl: default_lease_ttl(),
            state_ttl: default_state_ttl(),
            renew_interval: None,
            drain_timeout: default_drain_timeout(),
            heartbeat_interval: default_heartbeat_interval(),
        }
    }
}

fn default_lease_ttl() -> String {
    "30s".into()
}
fn default_state_ttl() -> String {
    "24h".into()
}
fn default_drain_timeout() -> String {
    "60s".into()
}
fn default_heartbeat_interval() -> String {
    "250ms".into()
}

/// The three stores of the turn protocol. An omitted dependency is managed
/// with defaults.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DependenciesSpec {
    /// Coordination store: leases, fences, state, idempotency records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisDependency>,
    /// Turn ledger and durable state copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<PostgresDependency>,
    /// Workspace files (S3-compatible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<ObjectStoreDependency>,
}

/// Set exactly one of `managed` or `external`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.managed) != has(self.external)").message("set exactly one of managed or external"))]
pub struct RedisDependency {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedRedis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalUrl>,
}

/// Set exactly one of `managed` or `external`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.managed) != has(self.external)").message("set exactly one of managed or external"))]
pub struct PostgresDependency {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedStore>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalUrl>,
}

/// Set exactly one of `managed` or `external`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.managed) != has(self.external)").message("set exactly one of managed or external"))]
pub struct ObjectStoreDependency {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedObjectStore>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalObjectStore>,
}

/// A single-instance store Baton runs as a StatefulSet on a PVC.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedStore {
    /// Image override; a pinned default is used when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096), pattern(IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Size of the data volume (default 1Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Quantity>,
    /// StorageClass of the data volume; the cluster default when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub storage_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Managed Redis: AOF persistence with `appendfsync everysec`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRedis {
    #[serde(flatten)]
    pub store: ManagedStore,
    /// Protect Redis with a generated password (default true).
    #[serde(default = "default_true")]
    pub auth: bool,
}

impl Default for ManagedRedis {
    fn default() -> Self {
        Self {
            store: ManagedStore::default(),
            auth: true,
        }
    }
}

fn default_true() -> bool {
    true
}

/// Managed MinIO plus a Job that creates the bucket.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedObjectStore {
    #[serde(flatten)]
    pub store: ManagedStore,
    #[serde(default = "default_bucket")]
    #[schemars(length(min = 3, max = 63), pattern(BUCKET_PATTERN))]
    pub bucket: String,
}

impl Default for ManagedObjectStore {
    fn default() -> Self {
        Self {
            store: ManagedStore::default(),
            bucket: default_bucket(),
        }
    }
}

fn default_bucket() -> String {
    "baton-workspaces".into()
}

/// A store that runs elsewhere; its connection URL (credentials included)
/// is read from a Secret in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalUrl {
    pub secret_ref: UrlSecretRef,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UrlSecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key holding the URL (default `url`).
    #[serde(default = "default_url_key")]
    #[schemars(length(min = 1, max = 253), pattern(SECRET_KEY_PATTERN))]
    pub url_key: String,
}

fn default_url_key() -> String {
    crate::constants::secret_keys::URL.into()
}

/// An S3-compatible object store that runs elsewhere. The Secret holds the
/// keys `endpoint`, `accessKeyId`, `secretAccessKey` and optionally `region`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalObjectStore {
    pub secret_ref: SecretRef,
    #[schemars(length(min = 3, max = 63), pattern(BUCKET_PATTERN))]
    pub bucket: String,
    /// Path-style addressing (`endpoint/bucket/key`), needed by MinIO and SeaweedFS.
    #[serde(default = "default_true")]
    pub force_path_style: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The injected `baton` sidecar container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// Image override; defaults to the Baton release this operator belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096), pattern(IMAGE_PATTERN))]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// How the operator replaces replicas on a change: one pod at a time (at
/// most `maxUnavailable`), each drained and its sessions handed over before
/// it is deleted, the next only once its replacement is ready.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("duration(self.progressDeadline) >= duration('10s') && duration(self.progressDeadline) <= duration('24h')").message("progressDeadline must be between 10s and 24h").field_path(".progressDeadline")
)]
pub struct RolloutSpec {
    /// Stop between pods; the ones already replaced and the old ones keep
    /// serving. Unset it (or `baton rollout resume`) to go on.
    #[serde(default)]
    pub paused: bool,
    /// Replicas drained and replaced at the same time.
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_unavailable: i32,
    /// How long a replaced pod may take to become ready before the rollout
    /// stops (`Progressing=False`, reason `ProgressDeadlineExceeded`) and
    /// touches no other pod.
    #[serde(default = "default_progress_deadline")]
    #[schemars(length(max = 64), pattern(DURATION_PATTERN))]
    pub progress_deadline: String,
    /// Let the rollout replace replicas with a sidecar whose data layout in
    /// the stores differs from the running one's. Replicas of two layouts
    /// must not share a Redis, so the rollout then takes every old replica
    /// out before a new one serves (sessions wait, none is lost). Without
    /// it the operator refuses such a rollout (condition `Progressing`,
    /// reason `LayoutIncompatible`).
    #[serde(default)]
    pub migrate_layout: bool,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            paused: false,
            max_unavailable: default_max_unavailable(),
            progress_deadline: default_progress_deadline(),
            migrate_layout: false,
        }
    }
}

fn default_max_unavailable() -> i32 {
    1
}

fn default_progress_deadline() -> String {
    "10m".into()
}

/// Observed state, written by the operator through the status subresource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Progressing, Degraded and, with managed stores, StoresReady.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub updated_replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// Label selector of the replica pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

/// Progress of a rolling release driven by the operator. Together with the
/// pods' revision labels it is the rollout's whole state (`draining` names
/// the pods being drained): an operator that restarts, or a new leader,
/// resumes from it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    pub phase: RolloutPhase,
    /// The revision being rolled out (the replica StatefulSet's update revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The pod being replaced now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// What happens to that pod now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<RolloutStep>,
    /// When the current step began (the progress deadline counts from the
    /// deletion of the old pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_at: Option<Time>,
    /// Replicas running the revision.
    #[serde(default)]
    pub updated: i32,
    /// Replicas wanted.
    #[serde(default)]
    pub total: i32,
    /// When this revision's rollout began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// The last thing the rollout did, in words (e.g. "drained demo-2 in
    /// 412 ms, 1 turn handed over").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<String>,
    /// Why the rollout waits or stopped, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The pods whose drain the rollout started, written before it asks
    /// their sidecars to drain: a pod is deleted only once it is listed
    /// here and its drain is over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<DrainingPod>,
}

/// A pod the rollout is draining.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainingPod {
    pub pod: String,
    /// The pod's uid: a pod of the same name that replaced it is not draining.
    pub uid: String,
    /// When its drain began.
    pub since: Time,
}

impl RolloutStatus {
    /// One line for people: `Progressing 1/3, demo-2 Draining: why`.
    pub fn summary(&self) -> String {
        let mut text = format!("{:?} {}/{}", self.phase, self.updated, self.total);
        if let (Some(pod), Some(step)) = (&self.pod, self.step) {
            text.push_str(&format!(", {pod} {step:?}"));
        }
        if let Some(message) = &self.message {
            text.push_str(&format!(": {message}"));
        }
        text
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// Every replica runs the update revision.
    #[default]
    Complete,
    /// Replicas are being drained and replaced one by one.
    Progressing,
    /// `spec.rollout.paused` is set.
    Paused,
    /// The rollout cannot make progress (see conditions).
    Stalled,
}

/// The steps of one pod's replacement, in order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutStep {
    /// New turns are refused; running ones get `drainTimeout` to finish.
    Draining,
    /// Drained; its sessions are handed over and the pod is deleted.
    Replacing,
    /// Waiting for the replacement pod of the new revision to be ready.
    WaitingReady,
}

/// Condition types in `status.conditions`.
pub mod condition_types {
    pub const READY: &str = "Ready";
    pub const PROGRESSING: &str = "Progressing";
    pub const DEGRADED: &str = "Degraded";
    /// Every managed store answers (its StatefulSet is ready, the bucket
    /// exists). Present only when at least one store is managed.
    pub const STORES_READY: &str = "StoresReady";
}
