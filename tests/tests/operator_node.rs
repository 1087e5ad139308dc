//! `baton operator` end to end: every example of `manifests/examples/`
//! applied with kubectl, reconciled by the operator (namespaced RBAC, its
//! ServiceAccount token) and run by the test node (`baton-testnode`, the
//! kubelet stand-in: there is no kubelet here). The stores start, the bucket
//! Job succeeds, the replicas pass their readiness probes, `kubectl get agd`
//! shows `Ready=True` with the counts, and a conversation started on one
//! replica pod's sidecar continues on another.
//!
//! Each example runs with 2 replicas (the examples ask for up to 5; two are
//! what a conversation across replicas needs, on a 2-core machine).

use baton_e2e::operator_support;

use std::collections::BTreeMap;
use std::time::Duration;

use baton_api::AgentDeployment;
use baton_api::names::ChildNames;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};
use operator_support::node::*;
use operator_support::*;

/// Stores, the bucket Job and the replicas starting one after another.
const START: Duration = Duration::from_secs(240);

/// The example with its spec's replica count set to `replicas`.
fn with_replicas(yaml: &str, replicas: u32) -> String {
    let mut found = false;
    let text = yaml
        .lines()
        .map(|line| {
            if line.starts_with("  replicas:") {
                found = true;
                format!("  replicas: {replicas}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(found, "no spec.replicas line in:\n{yaml}");
    text
}

fn names(yaml: &str) -> ChildNames {
    let agd = baton_api::parse::from_yaml(yaml).expect("the example parses");
    baton_api::validate(&agd)
        .expect("the example is valid")
        .names
}

fn ready_replicas(agd: &AgentDeployment) -> i32 {
    agd.status.as_ref().map_or(0, |s| s.ready_replicas)
}

/// Waits for `Ready=True` with every replica ready, then checks what
/// `kubectl get agd` prints for it.
async fn wait_ready(ns: &str, name: &str, replicas: i32) -> AgentDeployment {
    let what = format!("Ready=True with {replicas} ready replicas");
    let agd = wait_agd(ns, name, &what, START, |agd| {
        observed_current(agd)
            && condition(agd, "Ready").is_some_and(|c| c.0 == "True")
            && ready_replicas(agd) == replicas
    })
    .await;
    let table = kubectl_ok(control_plane(), &["get", "agd", name, "-n", ns], None);
    eprintln!("{table}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "REPLICAS",
            "AVAILABLE",
            "UPDATED",
            "ROLLOUT",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    let n = replicas.to_string();
    assert_eq!(
        row[..5],
        [name, "True", n.as_str(), n.as_str(), n.as_str()],
        "{table}"
    );
    agd
}

async fn chat(pod_ip: std::net::IpAddr, session: &str, input: &str) -> serde_json::Value {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{pod_ip}:7070/api/chat"))
        .json(&serde_json::json!({"sessionId": session, "input": input}))
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .expect("the sidecar answers")
        .json()
        .await
        .expect("a JSON reply")
}

/// "my name is …" on replica 0, "what is my name?" on replica 1.
async fn conversation_across_replicas(ns: &str, names: &ChildNames) {
    let node = node();
    let pod0 = format!("{}-0", names.replicas());
    let pod1 = format!("{}-1", names.replicas());
    let ip0 = node.pod_ip(ns, &pod0).expect("replica 0 has an IP");
    let ip1 = node.pod_ip(ns, &pod1).expect("replica 1 has an IP");
    let first = chat(ip0, "s-1", "my name is Lin").await;
    if first["status"] != "OK" {
        // What the stores said is what explains a refused turn.
        let stores = [names.minio(), names.redis(), names.postgres()];
        for pod in std::iter::once(pod0.clone()).chain(stores.iter().map(|s| format!("{s}-0"))) {
            eprintln!("---- {ns}/{pod} ----\n{}", node.logs(ns, &pod));
        }
    }
    assert_eq!(first["status"], "OK", "{first}");
    assert_eq!(first["replica"], pod0.as_str(), "{first}");
    let second = chat(ip1, "s-1", "what is my name?").await;
    assert_eq!(second["status"], "OK", "{second}");
    assert_eq!(second["replica"], pod1.as_str(), "{second}");
    assert_eq!(second["reply"], "Your name is Lin.", "{second}");
}

/// Every child the operator applied carries the recommended labels and a
/// controller owner reference to the resource.
async fn children_labelled_and_owned(ns: &str, agd: &AgentDeployment) {
    let client = control_plane().admin_client().await;
    let sets: Api<StatefulSet> = Api::namespaced(client, ns);
    let uid = agd.metadata.uid.clone();
    let owned = sets
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/managed-by=baton-operator,app.kubernetes.io/instance={}",
            agd.metadata.name.as_deref().unwrap()
        )))
        .await
        .unwrap();
    assert!(!owned.items.is_empty());
    for set in owned.items {
        let owner = set.metadata.owner_references.unwrap_or_default();
        assert!(
            owner
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref()),
            "{:?} is not controlled by the AgentDeployment",
            set.metadata.name
        );
    }
}

/// Applies an example (with 2 replicas) and checks it end to end.
async fn example_serves_a_conversation(file: &str, prepare: impl AsyncFnOnce(&str)) {
    let cp = control_plane();
    let client = cp.admin_client().await;
    let ns = namespace(&client, file.trim_end_matches(".yaml")).await;
    let _operator = namespaced_operator(cp, &ns);
    prepare(&ns).await;
    let yaml = with_replicas(&example(file), 2);
    apply_yaml(cp, &ns, &yaml);
    let names = names(&yaml);
    let name = names.replicas();
    let agd = wait_ready(&ns, &name, 2).await;
    children_labelled_and_owned(&ns, &agd).await;
    conversation_across_replicas(&ns, &names).await;
}

#[test]
fn minimal_example_runs_and_a_conversation_crosses_replicas() {
    run(example_serves_a_conversation("minimal.yaml", async |_| {}));
}

#[test]
fn managed_dependencies_example_runs_and_a_conversation_crosses_replicas() {
    run(example_serves_a_conversation(
        "managed-dependencies.yaml",
        async |_| {},
    ));
}

#[test]
fn custom_session_example_runs_and_a_conversation_crosses_replicas() {
    run(example_serves_a_conversation(
        "custom-session.yaml",
        async |ns| {
            // The Secret the example's agent reads its API key from.
            let client = control_plane().admin_client().await;
            create_secret(
                &client,
                ns,
                "travel-planner-llm",
                [("apiKey".into(), b"sk-test".to_vec())].into(),
            )
            .await;
        },
    ));
}

/// The stores the external example uses: run in the cluster by someone
/// else (here, another AgentDeployment with no replicas), reached through
/// the Secrets the example's comment asks for.
const SHARED_STORES: &str = "\
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata:
  name: shared-stores
spec:
  image: ghcr.io/acme/support-bot:1.4.2
  replicas: 0
  dependencies:
    objectStore:
      managed:
        bucket: acme-coding-agent-workspaces
";

#[test]
fn external_dependencies_example_runs_on_stores_it_does_not_manage() {
    run(async {
        example_serves_a_conversation_on_external_stores().await;
    });
}

async fn example_serves_a_conversation_on_external_stores() {
    let cp = control_plane();
    let client = cp.admin_client().await;
    let ns = namespace(&client, "external").await;
    let _operator = namespaced_operator(cp, &ns);

    apply_yaml(cp, &ns, SHARED_STORES);
    let stores = names(SHARED_STORES);
    wait_until_true(&client, &ns, "shared-stores", "StoresReady", START).await;

    // The example's Secrets, with the keys its comment names.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let read = async |name: String| -> BTreeMap<String, Vec<u8>> {
        let secret = secrets.get(&name).await.expect("store secret");
        secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()
    };
    let redis = read(stores.redis()).await;
    let postgres = read(stores.postgres()).await;
    let minio = read(stores.minio()).await;
    create_secret(
        &client,
        &ns,
        "coding-agent-redis",
        [("url".into(), redis["url"].clone())].into(),
    )
    .await;
    create_secret(
        &client,
        &ns,
        "coding-agent-postgres",
        [("dsn".into(), postgres["url"].clone())].into(),
    )
    .await;
    create_secret(&client, &ns, "coding-agent-s3", minio).await;

    // The test's S3 is addressed by a Service name: path-style requests.
    let yaml = with_replicas(&example("external-dependencies.yaml"), 2)
        .replace("forcePathStyle: false", "forcePathStyle: true");
    apply_yaml(cp, &ns, &yaml);
    let names = names(&yaml);
    let agd = wait_ready(&ns, "coding-agent", 2).await;
    assert!(
        condition(&agd, "StoresReady").is_none(),
        "no managed store, no StoresReady condition"
    );
    // Only the replicas run for it: no store of its own.
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let own: Vec<String> = sets
        .list(&ListParams::default().labels("app.kubernetes.io/instance=coding-agent"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(own, [names.replicas()]);
    // The sidecar's store settings come from the external Secrets.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods.get(&format!("{}-0", names.replicas())).await.unwrap();
    let secret_refs: Vec<String> = pod
        .spec
        .unwrap()
        .containers
        .iter()
        .flat_map(|c| c.env.clone().unwrap_or_default())
        .filter_map(|e| e.value_from?.secret_key_ref.map(|r| r.name))
        .collect();
    for secret in [
        "coding-agent-redis",
        "coding-agent-postgres",
        "coding-agent-s3",
    ] {
        assert!(
            secret_refs.iter().any(|r| r == secret),
            "{secret} not referenced: {secret_refs:?}"
        );
    }
    children_labelled_and_owned(&ns, &agd).await;
    conversation_across_replicas(&ns, &names).await;
}
