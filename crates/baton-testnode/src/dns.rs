//! Service names for pods, through each pod's hosts file (there is no
//! cluster DNS and no kube-proxy): every Service with a selector resolves to
//! the IP of one pod it selects, a Ready one when there is one; a headless
//! Service also names each of its pods (`pod.svc.ns.svc.cluster.local`, the
//! StatefulSet pod DNS). Short names (`svc`, `pod.svc`) resolve only in the
//! Service's own namespace, like the cluster's search path. A Service whose
//! port differs from its targetPort is reached on the targetPort: the name
//! points at a pod, not at a virtual IP.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service};

use crate::network::base_hosts;

/// The hosts file of a pod in `namespace` with address `ip`; with
/// `api_host`, the API server's Service names resolve to it (the node's
/// relay, see `api_proxy`).
pub(crate) fn hosts_file(
    own: &Pod,
    ip: std::net::Ipv4Addr,
    pods: &[Arc<Pod>],
    services: &[Arc<Service>],
    api_host: Option<std::net::Ipv4Addr>,
) -> String {
    let namespace = own.metadata.namespace.as_deref().unwrap_or_default();
    let mut out = base_hosts();
    let spec = own.spec.as_ref();
    let hostname = spec
        .and_then(|s| s.hostname.clone())
        .or_else(|| own.metadata.name.clone())
        .unwrap_or_default();
    let mut own_names = vec![hostname.clone()];
    if let Some(sub) = spec.and_then(|s| s.subdomain.as_deref()) {
        own_names.extend(qualified(&format!("{hostname}.{sub}"), namespace, true));
    }
    out.push_str(&format!("{ip}\t{}\n", own_names.join(" ")));
    if let Some(api) = api_host {
        out.push_str(&format!("{api}\t{}\n", crate::api_proxy::NAMES));
    }

    let mut services: Vec<&Arc<Service>> = services.iter().collect();
    services.sort_by_key(|s| (s.metadata.namespace.clone(), s.metadata.name.clone()));
    for svc in services {
        let (Some(name), Some(svc_ns)) = (&svc.metadata.name, &svc.metadata.namespace) else {
            continue;
        };
        let Some(spec) = &svc.spec else { continue };
        let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let same_ns = svc_ns == namespace;
        let mut selected: Vec<&Arc<Pod>> = pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(svc_ns))
            .filter(|p| {
                let labels = p.metadata.labels.as_ref();
                selector
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
            })
            .filter(|p| pod_ip(p).is_some() && !is_terminal(p))
            .collect();
        selected.sort_by_key(|p| {
            (
                !is_ready(p),
                p.metadata.deletion_timestamp.is_some(),
                p.metadata.name.clone(),
            )
        });
        if let Some(best) = selected.first().and_then(|p| pod_ip(p)) {
            out.push_str(&format!(
                "{best}\t{}\n",
                qualified(name, svc_ns, same_ns).join(" ")
            ));
        }
        if spec.cluster_ip.as_deref() == Some("None") {
            for pod in &selected {
                let pod_spec = pod.spec.as_ref();
                if pod_spec.and_then(|s| s.subdomain.as_deref()) != Some(name.as_str()) {
                    continue;
                }
                let Some(host) = pod_spec.and_then(|s| s.hostname.as_deref()) else {
                    continue;
                };
                if let Some(ip) = pod_ip(pod) {
                    let names = qualified(&format!("{host}.{name}"), svc_ns, same_ns);
                    out.push_str(&format!("{ip}\t{}\n", names.join(" ")));
                }
            }
        }
    }
    out
}

/// `name.ns`, `name.ns.svc`, `name.ns.svc.cluster.local`, and `name` when
/// the reader is in the same namespace.
fn qualified(name: &str, namespace: &str, with_short: bool) -> Vec<String> {
    let mut names = Vec::with_capacity(4);
    if with_short {
        names.push(name.to_owned());
    }
    names.push(format!("{name}.{namespace}"));
    names.push(format!("{name}.{namespace}.svc"));
    names.push(format!("{name}.{namespace}.svc.cluster.local"));
    names
}

fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !ip.is_empty())
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ip: &str, ready: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "labels": {"app": "db"}},
                "spec": {"containers": [], "hostname": name, "subdomain": "db"},
                "status": {"podIP": ip, "phase": "Running",
                    "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn services_resolve_to_a_ready_pod_and_headless_ones_name_each_pod() {
        let pods = vec![
            pod("db-0", "10.244.1.2", false),
            pod("db-1", "10.244.1.3", true),
        ];
        let svc: Arc<Service> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "db", "namespace": "ns"},
                "spec": {"clusterIP": "None", "selector": {"app": "db"}}
            }))
            .unwrap(),
        );
        let own = pod("db-0", "10.244.1.2", false);
        let hosts = hosts_file(
            &own,
            "10.244.1.2".parse().unwrap(),
            &pods,
            std::slice::from_ref(&svc),
            None,
        );
        assert!(hosts.contains("10.244.1.3\tdb db.ns db.ns.svc db.ns.svc.cluster.local\n"));
        assert!(hosts.contains("10.244.1.2\tdb-0.db db-0.db.ns db-0.db.ns.svc"));
        assert!(hosts.contains("10.244.1.3\tdb-1.db db-1.db.ns"));

        let mut other: Pod = (*own).clone();
        other.metadata.namespace = Some("elsewhere".into());
        let hosts = hosts_file(&other, "10.244.1.9".parse().unwrap(), &pods, &[svc], None);
        assert!(hosts.contains("10.244.1.3\tdb.ns db.ns.svc db.ns.svc.cluster.local\n"));
        assert!(!hosts.contains("\tdb "));
    }
}
