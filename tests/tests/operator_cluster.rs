//! Cluster-wide `baton operator` cases on a real control plane, one at a
//! time (each runs operators that watch every namespace, with the
//! ClusterRole of `baton operator rbac`): leader election with kill -9 and
//! with a clean shutdown, a right taken out of the role, and objects the
//! Rust types cannot read under a CRD without validation.

use baton_e2e::operator_support;

use std::time::{Duration, Instant};

use baton_api::AgentDeployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use operator_support::*;

/// The lease duration the operator uses (client-go's default).
const LEASE: Duration = Duration::from_secs(15);

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster_operator(
    cp: &baton_testkit::kube::ControlPlane,
    home: &str,
    identity: &str,
    without_rule: Option<usize>,
) -> Operator {
    let kubeconfig = operator_credentials(cp, home, None, without_rule);
    Operator::start(
        cp,
        OperatorOptions {
            kubeconfig,
            watch_namespace: None,
            lease_namespace: home,
            identity,
            extra_args: &[],
        },
    )
}

async fn wait_leader(operator: &Operator) {
    baton_testkit::poll_async_every(
        POLL,
        CONVERGE,
        &format!("{} to lead", operator.identity),
        || async { operator.is_leader().await.then_some(()) },
    )
    .await;
}

async fn lease_holder(client: &kube::Client, ns: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    leases
        .get_opt("baton-operator")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// A fresh home namespace with two operators (the first leads, the
/// second stands by) and the minimal example, reconciled by the leader, in
/// a fresh namespace.
async fn leader_standby_and_example(
    client: &kube::Client,
    prefix: &str,
    [leader, standby]: [&str; 2],
) -> (String, String, Operator, Operator) {
    let cp = control_plane();
    let home = namespace(client, "baton-system").await;
    let ns = namespace(client, prefix).await;
    let first = cluster_operator(cp, &home, leader, None);
    wait_leader(&first).await;
    let second = cluster_operator(cp, &home, standby, None);
    apply_yaml(cp, &ns, &example("minimal.yaml"));
    wait_for_agd(client, &ns, "support-bot", "the leader to reconcile", |a| {
        observed_current(a) && condition(a, "Ready").is_some()
    })
    .await;
    (home, ns, first, second)
}

/// The change the tests wait for an operator to reconcile.
async fn scale_to_three(client: &kube::Client, ns: &str) {
    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), ns);
    api.patch(
        "support-bot",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_applies_and_a_standby_takes_over_within_a_lease_after_kill_9() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = control_plane();
    let client = cp.admin_client().await;
    let (home, ns, mut first, second) =
        leader_standby_and_example(&client, "leader", ["operator-a", "operator-b"]).await;
    assert_eq!(
        lease_holder(&client, &home).await.as_deref(),
        Some("operator-a")
    );
    // The standby is up (it answers its probes) and has written nothing.
    assert!(
        second.metrics().await.is_some(),
        "the standby serves /metrics"
    );
    assert!(!second.is_leader().await);
    assert_eq!(second.writes().await, 0.0, "a standby wrote to the API");

    first.kill();
    let killed = Instant::now();
    scale_to_three(&client, &ns).await;
    wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "the standby to reconcile the change",
        |a| observed_current(a) && a.status.as_ref().is_some_and(|s| s.replicas == 3),
    )
    .await;
    let took = killed.elapsed();
    eprintln!(
        "takeover after kill -9: the change was reconciled {} ms after the kill",
        took.as_millis()
    );
    assert!(second.is_leader().await);
    assert_eq!(
        lease_holder(&client, &home).await.as_deref(),
        Some("operator-b")
    );
    // The lease expires at most one lease duration after the kill; the
    // slack covers the first list of every watch on a loaded machine.
    assert!(took < LEASE + Duration::from_secs(5), "took {took:?}");
}

/// A leader paused past its renewal deadline (SIGSTOP stands for a frozen
/// VM, a long stall, a partition from the API server) wakes with watch
/// events queued while the Lease belongs to another. Here the standby took
/// the Lease and is paused in turn, so its Lease is still valid and nobody
/// reconciles the change made meanwhile: the woken leader must not either.
/// Its writes are refused before they reach the API server, and it stops
/// (its restart rejoins as a standby). The change waits for the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_writes_nothing_when_it_wakes_while_another_holds_the_lease() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = control_plane();
    let client = cp.admin_client().await;
    let (home, ns, mut first, second) =
        leader_standby_and_example(&client, "paused", ["operator-e", "operator-f"]).await;
    let writes_before_pause = first.settled_writes().await;
    assert!(writes_before_pause > 0.0, "the leader applied the example");

    baton_testkit::send_signal(first.pid(), "STOP");
    let paused = Instant::now();
    wait_leader(&second).await;
    eprintln!(
        "a paused leader was replaced in {} ms",
        paused.elapsed().as_millis()
    );
    baton_testkit::send_signal(second.pid(), "STOP");
    scale_to_three(&client, &ns).await;

    baton_testkit::send_signal(first.pid(), "CONT");
    let status = first.wait_exit(Duration::from_secs(30));
    baton_testkit::send_signal(second.pid(), "CONT");
    let status = status.expect("the woken leader stops");
    assert!(
        !status.success(),
        "a leader that lost its Lease exits non-zero"
    );
    let log = first.log_text();
    let stopped = log
        .lines()
        .find(|l| l.contains("stopping") && l.contains("writes="))
        .unwrap_or_else(|| panic!("no line says why the leader stopped:\n{log}"));
    let writes: f64 = stopped
        .split("writes=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no write count in {stopped:?}"));
    assert_eq!(
        writes, writes_before_pause,
        "the woken leader wrote to the API while another held the Lease: {stopped}"
    );
    // The holder, woken, reconciles the change.
    wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "the Lease holder to reconcile the change",
        |a| observed_current(a) && a.status.as_ref().is_some_and(|s| s.replicas == 3),
    )
    .await;
    assert_eq!(
        lease_holder(&client, &home).await.as_deref(),
        Some("operator-f")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_cleanly_releases_the_lease_at_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = control_plane();
    let client = cp.admin_client().await;
    let home = namespace(&client, "baton-system").await;
    let first = cluster_operator(cp, &home, "operator-c", None);
    wait_leader(&first).await;
    let second = cluster_operator(cp, &home, "operator-d", None);
    baton_testkit::poll_async_every(POLL, CONVERGE, "the standby to be up", || async {
        second.metrics().await.map(|_| ())
    })
    .await;
    let stopped = Instant::now();
    baton_testkit::send_signal(first.pid(), "TERM");
    wait_leader(&second).await;
    let took = stopped.elapsed();
    eprintln!("takeover after SIGTERM: {} ms", took.as_millis());
    // The standby looks at the Lease every 2 s (client-go's RetryPeriod);
    // waiting for the 15 s expiry would mean the Lease was not released.
    assert!(
        took < Duration::from_secs(8),
        "a released lease was taken only after {took:?}"
    );
    assert_eq!(
        lease_holder(&client, &home).await.as_deref(),
        Some("operator-d")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_statefulsets_rule_the_operator_reports_the_missing_watch_and_recovers_when_granted()
 {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = control_plane();
    let client = cp.admin_client().await;
    let home = namespace(&client, "baton-system").await;
    let ns = namespace(&client, "rbac").await;
    let rule = baton_operator::rbac::RULES
        .iter()
        .position(|r| r.resources.contains(&"statefulsets"))
        .unwrap();
    let operator = cluster_operator(cp, &home, "operator-rbac", Some(rule));
    apply_yaml(cp, &ns, &example("minimal.yaml"));
    let agd = wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "Degraded: WatchNotReady",
        |a| condition(a, "Degraded").is_some_and(|c| c.1 == "WatchNotReady"),
    )
    .await;
    let message = condition(&agd, "Degraded").unwrap().2;
    assert!(
        message.contains("StatefulSet") && message.contains("baton operator rbac"),
        "{message}"
    );
    // The reconcile metric says which error it was.
    let failures = r#"baton_operator_reconciles_total{result="error",error="watch_not_ready"}"#;
    assert!(
        operator.counter(failures).await >= 1.0,
        "{failures} in:\n{}",
        operator.metrics().await.unwrap_or_default()
    );

    // Grant the full role: the watch recovers on its own.
    operator_credentials(cp, &home, None, None);
    wait_for_agd(
        &client,
        &ns,
        "support-bot",
        "recovery after the right is granted",
        |a| observed_current(a) && condition(a, "Degraded").is_some_and(|c| c.0 == "False"),
    )
    .await;
}

/// The CRD with validation switched off: spec and status accept anything.
fn loose_crd() -> String {
    let strict = std::fs::read_to_string(format!(
        "{REPO}/manifests/crds/agentdeployments.baton.dev.yaml"
    ))
    .unwrap();
    let mut crd: serde_json::Value = serde_yaml::from_str(&strict).unwrap();
    let anything =
        serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = serde_json::json!({
        "type": "object",
        "properties": {"spec": anything, "status": anything},
    });
    serde_json::to_string(&crd).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_object_or_a_cel_violation_under_a_crd_without_validation_stops_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cp = control_plane();
    let client = cp.admin_client().await;
    let home = namespace(&client, "baton-system").await;
    let ns = namespace(&client, "loose").await;
    kubectl_ok(
        cp,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&loose_crd()),
    );
    let _operator = cluster_operator(cp, &home, "operator-loose", None);

    let malformed = "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {name: broken}\nspec: {image: 42, replicas: 1, session: oops}\n";
    apply_yaml(cp, &ns, malformed);
    // Only CEL catches this one (leaseTtl below 2s); the Rust rules catch it too.
    let cel_only = std::fs::read_to_string(format!(
        "{REPO}/tests/fixtures/invalid/lease-too-short.yaml"
    ))
    .unwrap();
    let cel_only = cel_only.replace("name: bot", "name: lease-too-short");
    apply_yaml(cp, &ns, &cel_only);
    apply_yaml(cp, &ns, &example("minimal.yaml"));

    let resource = kube::api::ApiResource::erase::<AgentDeployment>(&());
    let dynamic: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &resource);
    let broken = baton_testkit::poll_async_every(
        POLL,
        CONVERGE,
        "the malformed object's condition",
        || async {
            let object = dynamic.get("broken").await.ok()?;
            let conditions = object.data["status"]["conditions"].as_array()?.clone();
            conditions
                .into_iter()
                .find(|c| c["type"] == "Degraded" && c["reason"] == "MalformedObject")
        },
    )
    .await;
    assert!(
        broken["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("invalid type"),
        "{broken}"
    );

    let cel = wait_for_agd(
        &client,
        &ns,
        "lease-too-short",
        "InvalidSpec from the Rust rules",
        |a| condition(a, "Ready").is_some_and(|c| c.1 == "InvalidSpec"),
    )
    .await;
    assert!(
        condition(&cel, "Ready")
            .unwrap()
            .2
            .contains("spec.session.leaseTtl")
    );
    // The good one next to them is reconciled as usual.
    wait_for_agd(&client, &ns, "support-bot", "the valid resource", |a| {
        observed_current(a) && condition(a, "Degraded").is_some_and(|c| c.0 == "False")
    })
    .await;

    // Back to the real CRD for the other tests (after removing what it refuses).
    kubectl_ok(
        cp,
        &["delete", "agd", "broken", "lease-too-short", "-n", &ns],
        None,
    );
    kubectl_ok(
        cp,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &format!("{REPO}/manifests/crds/"),
        ],
        None,
    );
}
