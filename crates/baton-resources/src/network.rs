//! The deployment's NetworkPolicies: who may reach its pods.
//!
//! - The replicas: anyone may reach the turn port (the client Service's
//!   clients cannot be named: they are whoever the user exposes it to);
//!   only the admin clients (the operator's and the dashboard's pods, marked
//!   `baton.dev/admin-client: "true"` in the operator's namespace) reach the
//!   admin port; nothing reaches the agent container's port from outside the
//!   pod (the sidecar calls it over the pod's loopback, which no policy
//!   filters).
//! - The managed stores: only the deployment's own pods (replicas, the other
//!   store pods, the bucket Job) and the admin clients (a dashboard reads
//!   the stores).
//!
//! Egress is left open: agents call models and tools wherever they are.
//! Kubelet probes come from the node, which the common network plugins
//! admit whatever the policy says.

use std::collections::BTreeMap;

use baton_api::ValidAgentDeployment;
use baton_api::constants::{labels, ports};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::meta::{App, label_selector, object_meta};

/// The label that admits a pod to the sidecars' admin port and the managed
/// stores, in the admin clients' namespace.
pub const ADMIN_CLIENT_LABEL: &str = "baton.dev/admin-client";

/// The label every namespace carries with its own name (set by the API
/// server since Kubernetes 1.22).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Where the pods that call the admin API live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminClients {
    /// The operator's namespace; its pods labelled
    /// `baton.dev/admin-client: "true"` are the admin clients.
    pub namespace: String,
}

/// The admin clients, as a peer of an ingress rule.
fn admin_clients(clients: &AdminClients) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_owned(),
                clients.namespace.clone(),
            )])),
            ..LabelSelector::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                ADMIN_CLIENT_LABEL.to_owned(),
                "true".to_owned(),
            )])),
            ..LabelSelector::default()
        }),
        ip_block: None,
    }
}

fn tcp(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".into()),
        end_port: None,
    }
}

fn ingress_only(
    pod_selector: LabelSelector,
    ingress: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicySpec {
    NetworkPolicySpec {
        pod_selector: Some(pod_selector),
        policy_types: Some(vec!["Ingress".into()]),
        ingress: Some(ingress),
        egress: None,
    }
}

/// The replicas' policy: the turn port to all, the admin port to the admin
/// clients, no other port.
pub fn replicas(agd: &ValidAgentDeployment, clients: &AdminClients) -> NetworkPolicy {
    NetworkPolicy {
        metadata: object_meta(agd, App::Agent, agd.names.replicas()),
        spec: Some(ingress_only(
            label_selector(agd, App::Agent),
            vec![
                NetworkPolicyIngressRule {
                    // No `from`: every source.
                    from: None,
                    ports: Some(vec![tcp(ports::SIDECAR_HTTP)]),
                },
                NetworkPolicyIngressRule {
                    from: Some(vec![admin_clients(clients)]),
                    ports: Some(vec![tcp(ports::SIDECAR_ADMIN)]),
                },
            ],
        )),
    }
}

/// The managed stores' policy (when any store is managed): every port, to
/// the deployment's own pods and the admin clients only.
pub fn stores(agd: &ValidAgentDeployment, clients: &AdminClients) -> NetworkPolicy {
    let own_pods = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            labels::INSTANCE.to_owned(),
            agd.name.clone(),
        )])),
        ..LabelSelector::default()
    };
    let store_pods = LabelSelector {
        match_labels: own_pods.match_labels.clone(),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: labels::COMPONENT.to_owned(),
            operator: "In".into(),
            values: Some(
                [App::Redis, App::Postgres, App::Minio]
                    .iter()
                    .map(|app| app.component().to_owned())
                    .collect(),
            ),
        }]),
    };
    NetworkPolicy {
        metadata: object_meta(agd, App::Agent, agd.names.stores_network_policy()),
        spec: Some(ingress_only(
            store_pods,
            vec![NetworkPolicyIngressRule {
                from: Some(vec![
                    NetworkPolicyPeer {
                        pod_selector: Some(own_pods),
                        ..NetworkPolicyPeer::default()
                    },
                    admin_clients(clients),
                ]),
                ports: None,
            }],
        )),
    }
}
