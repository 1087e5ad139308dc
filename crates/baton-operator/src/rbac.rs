//! The operator's least-privilege RBAC, from one table: `baton operator rbac`
//! prints it, `manifests/rbac/` holds it (CI checks the drift), the chart
//! and the tests use it.

use std::collections::BTreeMap;

use baton_api::constants::{GROUP, labels};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

/// Name of the operator's ServiceAccount, roles and bindings.
pub const NAME: &str = "baton-operator";

/// One rule of the operator's role: API group, resources, verbs and why.
pub struct Rule {
    pub group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub why: &'static str,
}

const READ: &[&str] = &["get", "list", "watch"];
/// Children are read from the watch caches (list, watch), written with
/// server-side apply (`patch`, and `create` for a new object) and pruned.
const OWN: &[&str] = &["list", "watch", "create", "patch", "delete"];

/// Every right the operator needs, and nothing more.
pub const RULES: &[Rule] = &[
    Rule {
        group: GROUP,
        resources: &["agentdeployments"],
        verbs: READ,
        why: "watch the resources it reconciles",
    },
    Rule {
        group: GROUP,
        resources: &["agentdeployments/status"],
        verbs: &["patch"],
        why: "write their status",
    },
    Rule {
        group: GROUP,
        resources: &["agentdeployments/finalizers"],
        verbs: &["update"],
        why: "set blockOwnerDeletion on children where OwnerReferencesPermissionEnforcement is on",
    },
    Rule {
        group: "",
        resources: &["serviceaccounts", "secrets", "configmaps", "services"],
        verbs: OWN,
        why: "apply and prune the children",
    },
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: &["get"],
        why: "read the generated credentials and the external stores' Secrets by name",
    },
    Rule {
        group: "",
        resources: &["serviceaccounts"],
        verbs: &["get"],
        why: "check that a spec.serviceAccountName is marked for agents (baton.dev/agent-service-account)",
    },
    Rule {
        group: "apps",
        resources: &["statefulsets"],
        verbs: OWN,
        why: "apply and prune replica and store StatefulSets",
    },
    Rule {
        group: "batch",
        resources: &["jobs"],
        verbs: OWN,
        why: "apply and prune the bucket Job",
    },
    Rule {
        group: "networking.k8s.io",
        resources: &["networkpolicies"],
        verbs: OWN,
        why: "apply and prune the NetworkPolicies of the replicas and the managed stores",
    },
    Rule {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: OWN,
        why: "apply and prune the PodDisruptionBudget",
    },
    Rule {
        group: "",
        resources: &["pods"],
        verbs: &["list", "watch", "delete"],
        why: "replica pods: the status, and the rollout deletes a pod once drained (it marks draining pods in its own status, so it never patches a pod)",
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
        why: "record events",
    },
    Rule {
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get", "create", "patch"],
        why: "leader election (kube-lease-manager creates, reads and patches the Lease; the leader reads it back), in the operator's own namespace only: a Role there, never in the cluster role, so it cannot touch kube-system's or the nodes' leases",
    },
];

/// Whether a rule is the leader election Lease's, which is granted in the
/// operator's own namespace only.
fn is_lease_rule(rule: &Rule) -> bool {
    rule.group == "coordination.k8s.io"
}

/// The role's rules: every rule but the Lease's (and `skip`).
fn policy_rules(skip: Option<usize>) -> Vec<PolicyRule> {
    RULES
        .iter()
        .enumerate()
        .filter(|(i, rule)| Some(*i) != skip && !is_lease_rule(rule))
        .map(|(_, rule)| PolicyRule {
            api_groups: Some(vec![rule.group.to_owned()]),
            resources: Some(rule.resources.iter().map(|r| (*r).to_owned()).collect()),
            verbs: rule.verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..PolicyRule::default()
        })
        .collect()
}

/// The rule of the leader election Lease alone: the namespaced variant
/// grants it in the operator's own namespace.
fn leader_election_rules() -> Vec<PolicyRule> {
    RULES
        .iter()
        .filter(|rule| is_lease_rule(rule))
        .map(|rule| PolicyRule {
            api_groups: Some(vec![rule.group.to_owned()]),
            resources: Some(rule.resources.iter().map(|r| (*r).to_owned()).collect()),
            verbs: rule.verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..PolicyRule::default()
        })
        .collect()
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(BTreeMap::from([
            (labels::NAME.to_owned(), NAME.to_owned()),
            (labels::PART_OF.to_owned(), labels::PART_OF_VALUE.to_owned()),
            (labels::COMPONENT.to_owned(), "operator".to_owned()),
        ])),
        ..ObjectMeta::default()
    }
}

/// One RBAC object.
#[derive(Serialize)]
#[serde(untagged)]
pub enum RbacObject {
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
}

/// What to generate.
pub struct RbacOptions<'a> {
    /// The operator's own namespace (its ServiceAccount lives there).
    pub operator_namespace: &'a str,
    /// `Some(ns)`: a Role and RoleBinding in `ns` only (for `--namespace ns`);
    /// `None`: a ClusterRole for all namespaces.
    pub watch_namespace: Option<&'a str>,
    /// Leave out the rule with this index of [`RULES`] (a test shows one missing).
    pub without_rule: Option<usize>,
}

/// The ServiceAccount, the role and its binding.
pub fn objects(options: &RbacOptions<'_>) -> Vec<RbacObject> {
    let ns = options.operator_namespace;
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(ns.to_owned()),
        api_group: None,
    };
    let rules = policy_rules(options.without_rule);
    let mut out = vec![RbacObject::ServiceAccount(ServiceAccount {
        metadata: meta(NAME, Some(ns)),
        ..ServiceAccount::default()
    })];
    match options.watch_namespace {
        None => {
            out.push(RbacObject::ClusterRole(ClusterRole {
                metadata: meta(NAME, None),
                rules: Some(rules),
                aggregation_rule: None,
            }));
            out.push(RbacObject::ClusterRoleBinding(ClusterRoleBinding {
                metadata: meta(NAME, None),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: NAME.into(),
                },
                subjects: Some(vec![subject]),
            }));
        }
        Some(watched) => {
            out.push(RbacObject::Role(Role {
                metadata: meta(NAME, Some(watched)),
                rules: Some(rules),
            }));
            out.push(RbacObject::RoleBinding(RoleBinding {
                metadata: meta(NAME, Some(watched)),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: NAME.into(),
                },
                subjects: Some(vec![subject]),
            }));
        }
    }
    // Leader election happens in the operator's own namespace, whatever it
    // watches: a Role there, never a cluster-wide right to Leases.
    let name = format!("{NAME}-leader-election");
    out.push(RbacObject::Role(Role {
        metadata: meta(&name, Some(ns)),
        rules: Some(leader_election_rules()),
    }));
    out.push(RbacObject::RoleBinding(RoleBinding {
        metadata: meta(&name, Some(ns)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: NAME.into(),
            namespace: Some(ns.to_owned()),
            api_group: None,
        }]),
    }));
    out
}

/// The rules alone, for the Helm chart's templates
/// (`charts/baton/files/operator-rbac.yaml`): `rules` (the role) and
/// `leaderElectionRules` (the Lease rule, always granted by a Role in the
/// operator's own namespace). The chart names and binds them.
pub fn rules_yaml() -> Result<String, serde_yaml::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ChartRules {
        rules: Vec<PolicyRule>,
        leader_election_rules: Vec<PolicyRule>,
    }
    let mut out = String::from("# Generated by `baton operator rbac --rules`; do not edit.\n");
    out.push_str(&serde_yaml::to_string(&ChartRules {
        rules: policy_rules(None),
        leader_election_rules: leader_election_rules(),
    })?);
    Ok(out)
}

/// The objects as multi-document YAML, each rule's reason as a comment.
pub fn yaml(options: &RbacOptions<'_>) -> Result<String, serde_yaml::Error> {
    let mut out = String::from(
        "# Generated by `baton operator rbac`; do not edit.\n# Rules of the operator's role:\n",
    );
    for rule in RULES {
        let group = if rule.group.is_empty() {
            "core"
        } else {
            rule.group
        };
        out.push_str(&format!(
            "#   {group} {}: {} ({})\n",
            rule.resources.join(", "),
            rule.verbs.join(", "),
            rule.why
        ));
    }
    for object in objects(options) {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&object)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_wide_rbac_has_one_cluster_role_with_every_rule() {
        let objects = objects(&RbacOptions {
            operator_namespace: "baton-system",
            watch_namespace: None,
            without_rule: None,
        });
        let roles: Vec<&ClusterRole> = objects
            .iter()
            .filter_map(|o| {
                if let RbacObject::ClusterRole(r) = o {
                    Some(r)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(roles.len(), 1);
        let rules = roles[0].rules.as_ref().unwrap();
        assert_eq!(rules.len(), RULES.len() - 1);
        assert!(
            rules.iter().all(|r| !r
                .api_groups
                .iter()
                .flatten()
                .any(|g| g == "coordination.k8s.io")),
            "the cluster role grants no Lease anywhere"
        );
        let leases: Vec<_> = objects
            .iter()
            .filter_map(|o| match o {
                RbacObject::Role(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(leases.len(), 1);
        assert_eq!(
            leases[0].metadata.namespace.as_deref(),
            Some("baton-system")
        );
    }

    #[test]
    fn namespaced_rbac_has_no_cluster_role_and_a_lease_role_at_home() {
        let objects = objects(&RbacOptions {
            operator_namespace: "baton-system",
            watch_namespace: Some("team-a"),
            without_rule: None,
        });
        assert!(!objects.iter().any(|o| matches!(
            o,
            RbacObject::ClusterRole(_) | RbacObject::ClusterRoleBinding(_)
        )));
        let homes: Vec<_> = objects
            .iter()
            .filter_map(|o| {
                if let RbacObject::Role(r) = o {
                    r.metadata.namespace.clone()
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(homes, ["team-a", "baton-system"]);
    }

    #[test]
    fn a_rule_can_be_left_out() {
        let objects = objects(&RbacOptions {
            operator_namespace: "x",
            watch_namespace: None,
            without_rule: Some(0),
        });
        let RbacObject::ClusterRole(role) = &objects[1] else {
            panic!("cluster role second")
        };
        assert_eq!(role.rules.as_ref().unwrap().len(), RULES.len() - 2);
    }
}
