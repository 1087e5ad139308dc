//! Metadata shared by every child object: the recommended labels and the
//! controller owner reference back to the `AgentDeployment`.

use std::collections::BTreeMap;

use baton_api::constants::labels;
use baton_api::{AgentDeployment, ValidAgentDeployment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;

/// The application a child object belongs to: its `app.kubernetes.io/name`
/// and `app.kubernetes.io/component` labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum App {
    /// The agent replicas (agent container + sidecar) and their Services.
    Agent,
    Redis,
    Postgres,
    Minio,
    /// The Job that creates the bucket in the managed MinIO.
    BucketInit,
}

impl App {
    pub fn name(self) -> &'static str {
        match self {
            Self::Agent => "baton-agent",
            Self::Redis => "redis",
            Self::Postgres => "postgres",
            Self::Minio | Self::BucketInit => "minio",
        }
    }

    pub fn component(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Redis => "coordination-store",
            Self::Postgres => "ledger",
            Self::Minio => "object-store",
            Self::BucketInit => "bucket-init",
        }
    }
}

/// The uid put in owner references when the resource has none yet (a file
/// rendered before it was ever applied). The API server rejects it, which is
/// what we want: only the operator, which reads the real uid, applies.
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

/// Labels that select the pods of one app of one `AgentDeployment`. The
/// component is part of it: the bucket Job's pods must not match MinIO's Service.
pub fn selector_labels(agd: &ValidAgentDeployment, app: App) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::NAME.to_owned(), app.name().to_owned()),
        (labels::INSTANCE.to_owned(), agd.name.clone()),
        (labels::COMPONENT.to_owned(), app.component().to_owned()),
    ])
}

pub fn label_selector(agd: &ValidAgentDeployment, app: App) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector_labels(agd, app)),
        ..LabelSelector::default()
    }
}

/// All recommended labels of one app's objects.
pub fn labels(agd: &ValidAgentDeployment, app: App) -> BTreeMap<String, String> {
    let mut all = selector_labels(agd, app);
    all.extend([
        (labels::PART_OF.to_owned(), labels::PART_OF_VALUE.to_owned()),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ]);
    all
}

/// The controller owner reference to the `AgentDeployment`.
pub fn owner_reference(agd: &ValidAgentDeployment) -> OwnerReference {
    let meta = &agd.resource.metadata;
    OwnerReference {
        api_version: AgentDeployment::api_version(&()).into_owned(),
        kind: AgentDeployment::kind(&()).into_owned(),
        name: agd.name.clone(),
        uid: meta
            .uid
            .clone()
            .unwrap_or_else(|| PLACEHOLDER_UID.to_owned()),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Metadata of a child object: name, namespace, labels, owner reference.
pub fn object_meta(agd: &ValidAgentDeployment, app: App, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: agd.resource.metadata.namespace.clone(),
        labels: Some(labels(agd, app)),
        owner_references: Some(vec![owner_reference(agd)]),
        ..ObjectMeta::default()
    }
}
