//! The scheduler's part: every pending pod without a node (and meant for
//! the default scheduler) is bound to this node through the `binding`
//! subresource. Taints, affinities and resources are not considered: there
//! is one node and it fits everything.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// Whether a scheduler would look at `pod`.
pub(crate) fn wants_node(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let unbound = spec.node_name.as_deref().is_none_or(str::is_empty);
    let ours = spec
        .scheduler_name
        .as_deref()
        .is_none_or(|s| s == "default-scheduler");
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    unbound
        && ours
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Binds `pod` to `node`.
pub(crate) async fn bind(client: &kube::Client, pod: &Pod, node: &str) -> kube::Result<()> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": pod.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.create_subresource::<_, serde_json::Value>(
        "binding",
        name,
        &PostParams::default(),
        &binding,
    )
    .await?;
    Ok(())
}
