//! `baton operator` against a real control plane (etcd, kube-apiserver with
//! RBAC, kube-controller-manager). Each test has its own namespace and its
//! own operator process, which runs with a ServiceAccount token bound to the
//! namespaced RBAC of `baton operator rbac` and nothing more. No node runs
//! pods here (StatefulSet pods stay Pending): `operator_node.rs` adds the
//! test node; `operator_cluster.rs` has the cluster-wide cases.

use baton_e2e::operator_support;

use std::collections::BTreeMap;

use baton_api::AgentDeployment;
use baton_api::constants::{FIELD_MANAGER, labels};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use operator_support::*;

/// Every child of `name` in `ns` (kind/name → metadata), found by the
/// instance label.
async fn children(client: &Client, ns: &str, name: &str) -> BTreeMap<String, ObjectMeta> {
    let params = ListParams::default().labels(&format!("{}={name}", labels::INSTANCE));
    let mut out = BTreeMap::new();
    macro_rules! collect {
        ($($kind:ty),*) => {$(
            let api: Api<$kind> = Api::namespaced(client.clone(), ns);
            for object in api.list(&params).await.expect("list children") {
                let meta = object.meta().clone();
                out.insert(format!("{}/{}", <$kind as k8s_openapi::Resource>::KIND, meta.name.clone().unwrap_or_default()), meta);
            }
        )*};
    }
    collect!(
        ServiceAccount,
        Secret,
        ConfigMap,
        Service,
        StatefulSet,
        Job,
        NetworkPolicy,
        PodDisruptionBudget
    );
    out
}

/// What the operator writes of each child: the hash of what it applied and
/// the generation (resource versions also move with the status the
/// controller-manager writes, so they would not tell).
fn applied(children: &BTreeMap<String, ObjectMeta>) -> BTreeMap<String, (String, Option<i64>)> {
    children
        .iter()
        .map(|(k, m)| {
            let hash = m
                .annotations
                .as_ref()
                .and_then(|a| a.get(baton_api::constants::annotations::APPLIED_HASH))
                .cloned();
            (
                k.clone(),
                (
                    hash.expect("every child carries its applied hash"),
                    m.generation,
                ),
            )
        })
        .collect()
}

/// The children the README promises for a resource with every store managed.
const ALL_MANAGED: [&str; 19] = [
    "ServiceAccount/support-bot",
    "Secret/support-bot-redis",
    "Secret/support-bot-postgres",
    "Secret/support-bot-minio",
    "Secret/support-bot-admin",
    "ConfigMap/support-bot-config",
    "Service/support-bot-redis",
    "Service/support-bot-postgres",
    "Service/support-bot-minio",
    "Service/support-bot",
    "Service/support-bot-headless",
    "NetworkPolicy/support-bot",
    "NetworkPolicy/support-bot-stores",
    "StatefulSet/support-bot-redis",
    "StatefulSet/support-bot-postgres",
    "StatefulSet/support-bot-minio",
    "StatefulSet/support-bot",
    "Job/support-bot-minio-bucket",
    "PodDisruptionBudget/support-bot",
];

/// The notes of the resource's events with this reason.
fn event_notes(cp: &baton_testkit::kube::ControlPlane, ns: &str, reason: &str) -> Vec<String> {
    let events = kubectl_ok(
        cp,
        &["get", "events.events.k8s.io", "-n", ns, "-o", "json"],
        None,
    );
    let events: serde_json::Value = serde_json::from_str(&events).unwrap();
    events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["kind"] == "AgentDeployment")
        .filter_map(|e| e["note"].as_str().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_example_gets_every_child_labelled_and_owned_then_a_resync_writes_nothing() {
    let Deployed {
        cp,
        client,
        ns,
        operator,
        agd,
    } = Deployed::minimal("minimal").await;
    let uid = agd.metadata.uid.clone().unwrap();
    let found = children(&client, &ns, "support-bot").await;
    let names: Vec<&str> = found.keys().map(String::as_str).collect();
    let mut expected = ALL_MANAGED.to_vec();
    expected.sort();
    assert_eq!(names, expected);
    // One event names what was created.
    let created = event_notes(cp, &ns, "Created");
    for child in &expected {
        assert!(
            created.iter().any(|note| note.contains(child)),
            "no Created event names {child}: {created:?}"
        );
    }
    for (key, meta) in &found {
        let labels = meta.labels.clone().unwrap_or_default();
        for label in [
            labels::NAME,
            labels::INSTANCE,
            labels::COMPONENT,
            labels::MANAGED_BY,
            labels::PART_OF,
        ] {
            assert!(labels.contains_key(label), "{key} lacks label {label}");
        }
        let owner = meta
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .expect("owner reference");
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("AgentDeployment", uid.as_str(), Some(true)),
            "{key}"
        );
        let managers: Vec<_> = meta
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert!(
            managers.contains(&FIELD_MANAGER.to_owned()),
            "{key} managed by {managers:?}"
        );
    }
    // The API server took the NetworkPolicies as built: the turn port open
    // to all, the admin port to the admin clients of the operator's
    // namespace.
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let replicas = policies.get("support-bot").await.unwrap();
    let rules = serde_json::to_value(&replicas.spec.unwrap().ingress).unwrap();
    assert_eq!(rules[0]["ports"][0]["port"], 7070, "{rules}");
    assert!(rules[0].get("from").is_none(), "{rules}");
    assert_eq!(rules[1]["ports"][0]["port"], 7071, "{rules}");
    assert_eq!(
        rules[1]["from"][0]["podSelector"]["matchLabels"]["baton.dev/admin-client"], "true",
        "{rules}"
    );
    assert!(
        rules[1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            .is_string(),
        "{rules}"
    );

    // No node runs the pods: the stores are not ready, and the status says so.
    let (status, reason, message) = condition(&agd, "Ready").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "StoresNotReady"),
        "{message}"
    );
    assert_eq!(condition(&agd, "StoresReady").unwrap().0, "False");
    let agd = wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "the StatefulSet's two pods in the status",
        |a| a.status.as_ref().is_some_and(|s| s.replicas == 2),
    )
    .await;
    let status = agd.status.clone().unwrap();
    assert!(status.update_revision.is_some() && status.selector.is_some());

    // A resync (an annotation bumps the resource version, not the spec)
    // writes nothing: not a child, not the status.
    let before = applied(&children(&client, &ns, "support-bot").await);
    let writes_before = operator.writes().await;
    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), &ns);
    let reconciles_before = operator.counter("baton_operator_reconciles_total").await;
    api.patch(
        "support-bot",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"test/nudge": "1"}}})),
    )
    .await
    .unwrap();
    baton_testkit::poll_async_every(POLL, CONVERGE, "a reconcile after the nudge", || async {
        (operator.counter("baton_operator_reconciles_total").await > reconciles_before)
            .then_some(())
    })
    .await;
    assert_eq!(
        operator.writes().await,
        writes_before,
        "a no-op reconcile wrote to the API"
    );
    assert_eq!(
        applied(&children(&client, &ns, "support-bot").await),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_restart_changes_nothing() {
    let Deployed {
        cp,
        client,
        ns,
        mut operator,
        ..
    } = Deployed::example("restart", "managed-dependencies.yaml", "research-agent").await;
    // Without a node the pods stay Pending: this is the state the status settles in.
    let agd = wait_for_agd(&client, &ns, "research-agent", "a settled status", |a| {
        a.status.as_ref().is_some_and(|s| {
            s.replicas == a.spec.replicas
                && s.update_revision.is_some()
                && s.update_revision == s.current_revision
        })
    })
    .await;
    let before = applied(&children(&client, &ns, "research-agent").await);
    assert!(before.len() >= 15, "{before:?}");
    operator.kill();

    let second = namespaced_operator(cp, &ns);
    baton_testkit::poll_async_every(
        POLL,
        CONVERGE,
        "the new operator to reconcile once",
        || async { (second.counter("baton_operator_reconciles_total").await >= 1.0).then_some(()) },
    )
    .await;
    assert_eq!(
        applied(&children(&client, &ns, "research-agent").await),
        before
    );
    assert_eq!(
        second.writes().await,
        0.0,
        "the new operator wrote to the API:\n{}",
        second.metrics().await.unwrap_or_default()
    );
    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), &ns);
    assert_eq!(
        api.get("research-agent").await.unwrap().metadata.generation,
        agd.metadata.generation
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_image_is_a_new_revision_and_pods_that_serve_nothing_are_replaced_at_once() {
    let Scenario {
        cp,
        client,
        ns,
        operator: _operator,
    } = Scenario::new("update").await;
    apply_yaml(cp, &ns, &example("minimal.yaml"));
    let first = wait_for_agd(&client, &ns, "support-bot", "a first revision", |a| {
        observed_current(a)
            && a.status.as_ref().is_some_and(|s| {
                s.update_revision.is_some() && s.update_revision == s.current_revision
            })
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let replica_pods = ListParams::default().labels(&format!(
        "{}=support-bot,{}=agent",
        labels::INSTANCE,
        labels::COMPONENT
    ));
    let uids_before: Vec<_> = pods
        .list(&replica_pods)
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.metadata.uid.clone())
        .collect();
    assert_eq!(uids_before.len(), 2);

    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), &ns);
    api.patch(
        "support-bot",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"image": "ghcr.io/acme/support-bot:1.5.0"}})),
    )
    .await
    .unwrap();
    let first_revision = first.status.clone().unwrap().update_revision;
    let updated = wait_for_agd(&client, &ns, "support-bot", "a new update revision", |a| {
        observed_current(a)
            && a.status
                .as_ref()
                .is_some_and(|s| s.update_revision != first_revision && s.update_revision.is_some())
    })
    .await;
    let (status, reason, _) = condition(&updated, "Progressing").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "RevisionPending")
    );
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let template = sts
        .get("support-bot")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap();
    assert_eq!(
        template.containers[0].image.as_deref(),
        Some("ghcr.io/acme/support-bot:1.5.0")
    );
    // No node runs the pods here: they serve nothing, so the rollout
    // replaces them without waiting for a drain, and they come back at
    // the new revision (the rollout under load is tests/tests/operator_rollout.rs).
    let revision = updated.status.unwrap().update_revision.unwrap();
    baton_testkit::poll_async_every(POLL, CONVERGE, "the pods at the new revision", || {
        let pods = pods.clone();
        let (replica_pods, uids_before, revision) = (&replica_pods, &uids_before, &revision);
        async move {
            let now = pods.list(replica_pods).await.ok()?.items;
            let replaced = now.len() == 2
                && now.iter().all(|p| {
                    !uids_before.contains(&p.metadata.uid)
                        && p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("controller-revision-hash"))
                            == Some(revision)
                });
            replaced.then_some(())
        }
    })
    .await;
}

fn env_secret(sts: &StatefulSet, var: &str) -> Option<(String, String)> {
    let containers = &sts.spec.as_ref()?.template.spec.as_ref()?.containers;
    let sidecar = containers.iter().find(|c| c.name == "baton")?;
    let var = sidecar.env.as_ref()?.iter().find(|e| e.name == var)?;
    let key = var.value_from.as_ref()?.secret_key_ref.as_ref()?;
    Some((key.name.clone(), key.key.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_every_store_to_external_prunes_the_managed_ones_and_waits_for_their_secrets() {
    let Deployed {
        cp,
        client,
        ns,
        operator: _operator,
        ..
    } = Deployed::minimal("external").await;
    assert_eq!(
        children(&client, &ns, "support-bot").await.len(),
        ALL_MANAGED.len()
    );

    let external = r#"
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata: {name: support-bot}
spec:
  image: ghcr.io/acme/support-bot:1.4.2
  replicas: 2
  dependencies:
    redis: {external: {secretRef: {name: cloud-redis}}}
    postgres: {external: {secretRef: {name: cloud-postgres, urlKey: dsn}}}
    objectStore: {external: {secretRef: {name: cloud-s3}, bucket: team-workspaces}}
"#;
    apply_yaml(cp, &ns, external);
    let degraded = wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "Degraded for the missing Secrets",
        |a| {
            observed_current(a)
                && condition(a, "Degraded").is_some_and(|c| c.1 == "ExternalSecretMissing")
        },
    )
    .await;
    let (_, _, message) = condition(&degraded, "Degraded").unwrap();
    for secret in ["cloud-redis", "cloud-postgres", "cloud-s3"] {
        assert!(
            message.contains(&format!("Secret {ns}/{secret}")),
            "{message}"
        );
    }
    assert_eq!(
        condition(&degraded, "Ready").unwrap().1,
        "ExternalSecretMissing"
    );
    assert!(
        condition(&degraded, "StoresReady").is_none(),
        "no managed store left"
    );

    // The managed stores' objects are gone; the replicas read the external Secrets.
    let left: Vec<String> = children(&client, &ns, "support-bot")
        .await
        .into_keys()
        .collect();
    assert_eq!(
        left,
        [
            "ConfigMap/support-bot-config",
            "NetworkPolicy/support-bot",
            "PodDisruptionBudget/support-bot",
            "Secret/support-bot-admin",
            "Service/support-bot",
            "Service/support-bot-headless",
            "ServiceAccount/support-bot",
            "StatefulSet/support-bot",
        ]
    );
    let pruned = event_notes(cp, &ns, "Pruned");
    for child in [
        "StatefulSet/support-bot-redis",
        "StatefulSet/support-bot-postgres",
        "StatefulSet/support-bot-minio",
        "Job/support-bot-minio-bucket",
        "NetworkPolicy/support-bot-stores",
    ] {
        assert!(
            pruned.iter().any(|note| note.contains(child)),
            "no Pruned event names {child}: {pruned:?}"
        );
    }
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let replicas = sts.get("support-bot").await.unwrap();
    assert_eq!(
        env_secret(&replicas, "BATON_REDIS_URL"),
        Some(("cloud-redis".into(), "url".into()))
    );
    assert_eq!(
        env_secret(&replicas, "BATON_DATABASE_URL"),
        Some(("cloud-postgres".into(), "dsn".into()))
    );
    assert_eq!(
        env_secret(&replicas, "BATON_S3_ENDPOINT"),
        Some(("cloud-s3".into(), "endpoint".into()))
    );
    // The data volumes of the pruned stores stay.
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &ns);
    let claim_names: Vec<_> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(
        claim_names.contains(&"data-support-bot-redis-0".to_owned()),
        "{claim_names:?}"
    );

    // The Secrets appear (one lacks a key first): Degraded clears.
    create_secret_literals(cp, &ns, "cloud-redis", &[("url", "redis://r:6379/0")]);
    create_secret_literals(
        cp,
        &ns,
        "cloud-postgres",
        &[("url", "postgres://wrong-key")],
    );
    create_secret_literals(
        cp,
        &ns,
        "cloud-s3",
        &[
            ("endpoint", "http://s3:9000"),
            ("accessKeyId", "a"),
            ("secretAccessKey", "b"),
        ],
    );
    let wrong_key = wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "only the wrong key reported",
        |a| {
            condition(a, "Degraded").is_some_and(|c| {
                c.2.contains("has no key \"dsn\"") && !c.2.contains("does not exist")
            })
        },
    )
    .await;
    assert!(
        condition(&wrong_key, "Degraded")
            .unwrap()
            .2
            .contains("cloud-postgres")
    );
    kubectl_ok(cp, &["delete", "secret", "cloud-postgres", "-n", &ns], None);
    create_secret_literals(cp, &ns, "cloud-postgres", &[("dsn", "postgres://p/baton")]);
    wait_for_agd(&client, &ns, "support-bot", "Degraded to clear", |a| {
        condition(a, "Degraded").is_some_and(|c| c.0 == "False")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_only_the_rust_rules_catch_are_refused_with_every_violation_and_nothing_changes() {
    let Deployed {
        cp,
        client,
        ns,
        operator,
        ..
    } = Deployed::minimal("invalid").await;
    let before = applied(&children(&client, &ns, "support-bot").await);

    // Each of these passes the API server's schema and CEL rules.
    let invalid = r#"
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata: {name: support-bot}
spec:
  image: ghcr.io/acme/support-bot:2.0.0
  replicas: 2
  agentPort: 7070
  env: [{name: BATON_LEASE_TTL, value: "1s"}]
  podLabels: {app.kubernetes.io/instance: someone-else}
"#;
    apply_yaml(cp, &ns, invalid);
    let agd = wait_for_agd(&client, &ns, "support-bot", "InvalidSpec", |a| {
        observed_current(a) && condition(a, "Ready").is_some_and(|c| c.1 == "InvalidSpec")
    })
    .await;
    let (_, _, message) = condition(&agd, "Ready").unwrap();
    for field in ["spec.agentPort", "spec.env[0].name", "spec.podLabels"] {
        assert!(message.contains(field), "{field} missing from: {message}");
    }
    assert!(message.starts_with("3 validation errors"), "{message}");
    assert_eq!(condition(&agd, "Degraded").unwrap().1, "InvalidSpec");
    assert_eq!(
        applied(&children(&client, &ns, "support-bot").await),
        before,
        "an invalid spec changed a child"
    );

    let events = kubectl_ok(
        cp,
        &["get", "events.events.k8s.io", "-n", &ns, "-o", "json"],
        None,
    );
    let events: serde_json::Value = serde_json::from_str(&events).unwrap();
    let invalid_events: Vec<&serde_json::Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "InvalidSpec" && e["type"] == "Warning")
        .collect();
    assert_eq!(
        invalid_events.len(),
        1,
        "one warning event: {invalid_events:?}"
    );
    assert!(
        invalid_events[0]["note"]
            .as_str()
            .unwrap()
            .contains("spec.agentPort")
    );

    // Fixing the spec recovers.
    apply_yaml(cp, &ns, &example("minimal.yaml"));
    wait_for_agd(&client, &ns, "support-bot", "recovery", |a| {
        observed_current(a) && condition(a, "Degraded").is_some_and(|c| c.0 == "False")
    })
    .await;
    drop(operator);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_fixtures_are_refused_by_the_api_server_or_marked_invalid_spec() {
    let cp = control_plane();
    let client = cp.admin_client().await;
    let ns = namespace(&client, "fixtures").await;
    let _operator = namespaced_operator(cp, &ns);
    let dir = format!("{REPO}/tests/fixtures/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut refused = 0;
    let mut marked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expects: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect:"))
            .map(|l| l.trim().to_owned())
            .collect();
        let fields: Vec<String> = expects
            .iter()
            .filter_map(|e| e.split(':').next().map(str::to_owned))
            .collect();
        // Fresh name per fixture, so one fixture's object does not meet the next.
        let (ok, out) = kubectl(
            cp,
            &["create", "-n", &ns, "-f", "-", "-o", "name"],
            Some(&text),
        );
        let name = file.file_stem().unwrap().to_string_lossy().to_string();
        if !ok {
            refused += 1;
            // The API server's message names a field of the fixture (or the YAML error).
            let names_field = fields.iter().any(|f| {
                let last = f
                    .rsplit('.')
                    .next()
                    .unwrap_or(f)
                    .split('[')
                    .next()
                    .unwrap_or(f);
                out.contains(last)
            });
            assert!(
                names_field || out.contains("error parsing") || out.contains("no matches for kind"),
                "{name}: {out} (expects {fields:?})"
            );
            continue;
        }
        marked += 1;
        let created = out.trim().rsplit('/').next().unwrap().to_owned();
        let agd = wait_for_agd(
            &client,
            &ns,
            &created,
            &format!("{name} marked InvalidSpec"),
            |a| condition(a, "Ready").is_some_and(|c| c.1 == "InvalidSpec"),
        )
        .await;
        let message = condition(&agd, "Ready").unwrap().2;
        for field in &fields {
            assert!(
                message.contains(field.as_str()),
                "{name}: {field} not in {message}"
            );
        }
        kubectl_ok(
            cp,
            &["delete", "agd", &created, "-n", &ns, "--wait=false"],
            None,
        );
        // The next fixture may reuse the name: wait until this one is gone.
        let api: Api<AgentDeployment> = Api::namespaced(client.clone(), &ns);
        baton_testkit::poll_async_every(POLL, CONVERGE, "the fixture to be deleted", || async {
            api.get_opt(&created)
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        })
        .await;
    }
    assert!(
        refused >= 10 && marked >= 5,
        "refused {refused}, marked {marked}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_resource_garbage_collects_every_child() {
    let Deployed {
        cp,
        client,
        ns,
        operator: _operator,
        ..
    } = Deployed::minimal("delete").await;
    kubectl_ok(cp, &["delete", "agd", "support-bot", "-n", &ns], None);
    let client2 = client.clone();
    let ns2 = ns.clone();
    baton_testkit::poll_async_every(
        POLL,
        CONVERGE,
        "the garbage collector to remove every child",
        || {
            let client = client2.clone();
            let ns = ns2.clone();
            async move {
                children(&client, &ns, "support-bot")
                    .await
                    .is_empty()
                    .then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_moves_the_replica_stateful_set_down_to_zero_and_back() {
    let Deployed {
        cp,
        client,
        ns,
        operator: _operator,
        ..
    } = Deployed::minimal("scale").await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    for replicas in [3, 0, 2] {
        kubectl_ok(
            cp,
            &[
                "scale",
                "agd/support-bot",
                "-n",
                &ns,
                &format!("--replicas={replicas}"),
            ],
            None,
        );
        let agd = wait_for_agd(
            &client,
            &ns,
            "support-bot",
            &format!("status.replicas = {replicas}"),
            |a| observed_current(a) && a.status.as_ref().is_some_and(|s| s.replicas == replicas),
        )
        .await;
        assert_eq!(
            sts.get("support-bot").await.unwrap().spec.unwrap().replicas,
            Some(replicas)
        );
        assert_eq!(agd.spec.replicas, replicas);
    }
    // kubectl reads the scale subresource back.
    let out = kubectl_ok(
        cp,
        &[
            "get",
            "--raw",
            &format!("/apis/baton.dev/v1alpha1/namespaces/{ns}/agentdeployments/support-bot/scale"),
        ],
        None,
    );
    let scale: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(scale["status"]["replicas"], 2);
    assert!(
        scale["status"]["selector"]
            .as_str()
            .unwrap()
            .contains("app.kubernetes.io/instance=support-bot")
    );
}

/// `spec.serviceAccountName` runs the pods under an account the user
/// picks: only one marked for agents, or anyone who may create an
/// AgentDeployment could run code under any account of the namespace
/// through the operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_service_account_marked_for_agents_runs_the_pods() {
    let cp = control_plane();
    let client = cp.admin_client().await;
    let ns = namespace(&client, "service-account").await;
    let _operator = namespaced_operator(cp, &ns);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    accounts
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "powerful"}})).unwrap(),
        )
        .await
        .unwrap();
    let spec = r#"
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata: {name: support-bot}
spec:
  image: ghcr.io/acme/support-bot:1.4.2
  replicas: 2
  serviceAccountName: powerful
"#;
    apply_yaml(cp, &ns, spec);
    let agd = wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "refused for its account",
        |a| observed_current(a) && condition(a, "Ready").is_some_and(|c| c.1 == "InvalidSpec"),
    )
    .await;
    let (_, _, message) = condition(&agd, "Ready").unwrap();
    assert!(
        message.contains("spec.serviceAccountName")
            && message.contains("baton.dev/agent-service-account=true"),
        "{message}"
    );
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(
        sts.get_opt("support-bot").await.unwrap().is_none(),
        "no pods under an account nobody marked"
    );
    // Its owner marks it: the deployment goes on (the operator looks again).
    accounts
        .patch(
            "powerful",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"baton.dev/agent-service-account": "true"}}
            })),
        )
        .await
        .unwrap();
    let sts_ready = baton_testkit::poll_async(
        std::time::Duration::from_secs(60),
        "the replica StatefulSet under the marked account",
        || async { sts.get_opt("support-bot").await.ok().flatten() },
    )
    .await;
    let template = sts_ready.spec.unwrap().template.spec.unwrap();
    assert_eq!(template.service_account_name.as_deref(), Some("powerful"));
}
