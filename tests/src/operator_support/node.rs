//! The test node (`baton-testnode`, the kubelet stand-in: there is no
//! kubelet here) of a test binary, on the binary's control plane, and what
//! tests that run pods share.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use baton_api::AgentDeployment;
use baton_testnode::{ImageTable, NodeConfig, Runner, TestNode};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use super::{baton, control_plane};

/// A sidecar image that stands in for a future build writing another data
/// layout (3): `baton` run with `BATON_DATA_LAYOUT=3`.
pub const NEXT_LAYOUT_IMAGE: &str = "ghcr.io/baton-dev/baton-next:3.0.0";

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
});

struct Node {
    node: TestNode,
    _work_dir: tempfile::TempDir,
}

/// One test node for the whole file, on the file's control plane.
pub fn node() -> &'static TestNode {
    static NODE: OnceLock<Node> = OnceLock::new();
    &NODE
        .get_or_init(|| {
            let cp = control_plane();
            let work_dir = tempfile::Builder::new()
                .prefix("baton-operator-node-")
                .tempdir()
                .expect("temp dir");
            baton_testkit::remove_on_exit(work_dir.path());
            let node = RUNTIME.block_on(async {
                let client = cp.admin_client().await;
                let next = work_dir.path().join("baton-next");
                std::fs::write(
                    &next,
                    format!("#!/bin/sh\nBATON_DATA_LAYOUT=3 exec {} \"$@\"\n", baton()),
                )
                .unwrap();
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).unwrap();
                let images = ImageTable::standard(baton())
                    .with(NEXT_LAYOUT_IMAGE, Runner::Baton { binary: next });
                let config = NodeConfig::new("node-0", work_dir.path(), images);
                TestNode::start(client, config)
                    .await
                    .expect("the test node starts")
            });
            Node {
                node,
                _work_dir: work_dir,
            }
        })
        .node
}

/// Runs a test on the file's runtime, with the node started first (its
/// start blocks on the same runtime, so it cannot happen inside a test).
pub fn run<F: Future>(test: F) -> F::Output {
    node();
    RUNTIME.block_on(test)
}

pub async fn create_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
    data: BTreeMap<String, Vec<u8>>,
) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret created");
}

/// Waits until `check` holds for the resource (reads every 250 ms); on a
/// timeout prints its status and the node's pods (their logs), then fails.
pub async fn wait_agd(
    ns: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&AgentDeployment) -> bool,
) -> AgentDeployment {
    let api: Api<AgentDeployment> = Api::namespaced(control_plane().admin_client().await, ns);
    let found = tokio::time::timeout(timeout, async {
        loop {
            if let Some(agd) = api.get_opt(name).await.ok().flatten()
                && check(&agd)
            {
                return agd;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    match found {
        Ok(agd) => agd,
        Err(_) => {
            let status = api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|a| a.status);
            eprintln!("{ns}/{name} status: {status:#?}");
            node().print_pods(ns).await;
            panic!("timed out after {timeout:?} waiting for {ns}/{name}: {what}");
        }
    }
}
