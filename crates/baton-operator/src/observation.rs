//! What a reconcile is decided from, as plain data: [`crate::observe`]
//! fills it in (the only part that reads), [`crate::decide`] reads it (and
//! nothing else), and the tests of `decide` build it by hand.

use std::collections::BTreeMap;

use baton_api::{AgentDeployment, ValidAgentDeployment};
use baton_resources::meta::{App, selector_labels};
use baton_resources::{ChildKind, Credentials, DesiredState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use crate::children::ChildKey;
use crate::rollout::{DrainProbe, LayoutMismatch};
use crate::rollout_io::LivePod;
use crate::status::{ReplicaObservation, StoreObservation};

/// Everything one reconcile of one `AgentDeployment` is decided from.
#[derive(Clone, Debug)]
pub struct Observation {
    pub agd: AgentDeployment,
    pub now: Timestamp,
    /// The replica StatefulSet as its status says, if it exists.
    pub replicas: Option<ReplicaObservation>,
    pub stage: Stage,
}

/// How far the reading went.
#[derive(Clone, Debug)]
pub enum Stage {
    /// Being deleted: the garbage collector removes the children.
    Deleting,
    /// The spec breaks rules (`field: message` each).
    Invalid(Vec<String>),
    /// `spec.serviceAccountName` may not be used, and why.
    AccountRefused(String),
    /// A valid spec, and the world it is reconciled against.
    Valid(Box<World>),
}

/// What exists for a valid `AgentDeployment`.
#[derive(Clone, Debug)]
pub struct World {
    /// The spec validated, with the operator's default sidecar image when
    /// it names none.
    pub valid: ValidAgentDeployment,
    /// The managed stores' credentials and the admin token: read back from
    /// their Secrets, generated where missing.
    pub credentials: Credentials,
    /// Each external store Secret the spec names, as read.
    pub external_secrets: Vec<ExternalSecret>,
    /// Every child the builder makes for this spec, as built (once per
    /// reconcile: `decide` applies them, with the replica count the
    /// rollout says).
    pub desired: DesiredState,
    /// The live metadata of each of them, by key.
    pub live: BTreeMap<ChildKey, ObjectMeta>,
    /// Every live child this resource controls (the prune candidates).
    pub owned: Vec<(ChildKind, ObjectMeta)>,
    /// The managed stores and the bucket Job, ready or not.
    pub stores: Vec<StoreObservation>,
    /// The replica StatefulSet's `spec.replicas`, if it exists.
    pub live_replicas: Option<i32>,
    /// Its update revision, once its controller has seen the template.
    pub update_revision: Option<String>,
    pub pods: Vec<LivePod>,
    /// What the sidecars of the draining pods said.
    pub probes: Vec<(String, DrainProbe)>,
    /// What a pod at the update revision said of the layouts, when they differ.
    pub layout_mismatch: Option<LayoutMismatch>,
}

/// An external store Secret: which spec field names it, the keys the
/// sidecar reads, and which of them it has (`None`: no such Secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalSecret {
    pub name: String,
    pub dependency: &'static str,
    pub wanted: Vec<String>,
    pub present: Option<Vec<String>>,
}

/// The label selector the status reports for `kubectl scale`.
pub fn selector(valid: &ValidAgentDeployment) -> String {
    selector_labels(valid, App::Agent)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
