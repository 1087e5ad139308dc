//! The node's own life, on a control plane of its own: registration and
//! heartbeat objects, stop (every process and namespace gone), a pod
//! deleted while no node runs, a second node of the same name picking up,
//! and cleanup on drop.

use std::path::Path;
use std::time::{Duration, Instant};

use baton_testkit::kube::ControlPlane;
use baton_testnode::{ImageTable, NodeConfig, TestNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

fn redis_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "redis",
                "image": "redis:7.2.5",
                "args": ["--save", ""],
                "readinessProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 1},
            }],
        },
    }))
    .expect("pod")
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn until<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut attempt: impl FnMut() -> Fut,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn netns_exists(netns: &str) -> bool {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(netns))
}

#[test]
fn stop_leaves_nothing_running_and_a_restarted_node_finishes_deletions() {
    let control_plane = ControlPlane::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = control_plane.admin_client().await;
        let images = ImageTable::standard("/nonexistent/baton");
        let first_dir = tempfile::tempdir().unwrap();
        let node = TestNode::start(
            client.clone(),
            NodeConfig::new("lifecycle", first_dir.path(), images.clone()),
        )
        .await
        .expect("node starts");

        // Registered Ready, with a lease renewed by the node.
        let nodes: Api<Node> = Api::all(client.clone());
        let registered = nodes.get("lifecycle").await.expect("Node object");
        let ready = registered
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready condition");
        assert_eq!(ready.status, "True");
        let lease: Lease = Api::namespaced(client.clone(), "kube-node-lease")
            .get("lifecycle")
            .await
            .expect("node lease");
        assert!(lease.spec.and_then(|s| s.renew_time).is_some());

        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        pods.create(&PostParams::default(), &redis_pod("survivor"))
            .await
            .expect("create pod");
        until("survivor Ready", || async {
            pods.get("survivor").await.ok().filter(is_ready)
        })
        .await;
        let pid = node.pid_of("default", "survivor", "redis").expect("pid");
        let netns = node.netns_of("default", "survivor").expect("netns");
        assert!(netns_exists(&netns));

        // Stop: the process and the namespace are gone, the pod object stays.
        node.stop().await;
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "redis-server {pid} still runs after stop"
        );
        assert!(!netns_exists(&netns), "{netns} still exists after stop");
        assert!(!Path::new("/etc/netns").join(&netns).exists());

        // Deleted while no node runs it: a bound pod waits for its node.
        pods.delete("survivor", &DeleteParams::default())
            .await
            .expect("delete");
        let pending = pods.get("survivor").await.expect("still there");
        assert!(pending.metadata.deletion_timestamp.is_some());

        // A node of the same name comes back: it completes the deletion and
        // runs new pods.
        let second_dir = tempfile::tempdir().unwrap();
        let node = TestNode::start(
            client.clone(),
            NodeConfig::new("lifecycle", second_dir.path(), images),
        )
        .await
        .expect("node starts again");
        until("survivor's deletion to complete", || async {
            pods.get_opt("survivor")
                .await
                .ok()
                .and_then(|p| p.is_none().then_some(()))
        })
        .await;
        pods.create(&PostParams::default(), &redis_pod("newcomer"))
            .await
            .expect("create pod");
        until("newcomer Ready", || async {
            pods.get("newcomer").await.ok().filter(is_ready)
        })
        .await;
        let pid = node.pid_of("default", "newcomer", "redis").expect("pid");
        let netns = node.netns_of("default", "newcomer").expect("netns");

        // Drop cleans up too.
        drop(node);
        assert!(!netns_exists(&netns), "{netns} still exists after drop");
        until("the newcomer's process to be gone after drop", || async {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            // Gone, or a zombie whose parent (this process) has not reaped it.
            stat.is_none_or(|s| s.contains(") Z ")).then_some(())
        })
        .await;
    });
}
