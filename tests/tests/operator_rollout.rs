//! Rolling releases on Kubernetes, end to end: `baton operator` (namespaced
//! RBAC, its ServiceAccount token) replaces the replica pods that the test
//! node runs (`baton-testnode`, the kubelet stand-in: there is no kubelet
//! here), while `baton bench --verify` drives turns through a Service (the
//! node's user-space proxy over the real EndpointSlices, as kube-proxy
//! would). Every deployment here runs on one set of stores (a store-only
//! AgentDeployment, reached through Secrets as external stores), so only
//! the replicas start per test. The tests run one at a time: a 2-core
//! machine runs one rollout under load well, not five.
//!
//! What is checked, as the rollout issue asks: zero failed, lost or
//! duplicated turns across a release and a scale-down under load, each pod
//! drained before it is deleted (a watch records every deletion), a turn
//! longer than the drain timeout aborted and its session moving on at once,
//! a broken version stopping the rollout after one pod, an operator killed
//! mid-rollout resumed by the next leader, pause and resume. The same load
//! over a plain StatefulSet `RollingUpdate` of the same pods is the
//! baseline; both are printed side by side (see BENCHMARKS.md).

use baton_e2e::operator_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_api::{AgentDeployment, RolloutPhase};
use baton_testkit::kube::ControlPlane;
use baton_testnode::ServiceProxy;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use operator_support::node::*;
use operator_support::*;
use tokio::sync::OnceCell;

/// The stores, then the replicas, starting.
const START: Duration = Duration::from_secs(240);
/// A rollout of three pods under load, on a loaded machine.
const ROLLOUT: Duration = Duration::from_secs(240);
/// Sessions and clients of the load (the issue's minimum).
const SESSIONS: u32 = 50;
const CLIENTS: u32 = 10;

const IMAGE_V1: &str = "ghcr.io/acme/support-bot:1.0.0";
const IMAGE_V2: &str = "ghcr.io/acme/support-bot:1.0.1";
/// Not in the node's image table: its containers never start.
const IMAGE_BROKEN: &str = "ghcr.io/acme/no-such-agent:9.9.9";

/// One test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The namespace every test of this file shares, with the stores running
/// and their Secrets (`rollout-redis`, `rollout-postgres`, `rollout-s3`).
async fn shared_namespace() -> &'static str {
    static NS: OnceCell<String> = OnceCell::const_new();
    NS.get_or_init(|| async {
        let cp = control_plane();
        let client = cp.admin_client().await;
        let ns = namespace(&client, "rollout").await;
        let _operator = operator(&ns, "stores");
        apply_yaml(cp, &ns, STORES);
        wait_until_true(&client, &ns, "stores", "StoresReady", START).await;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        for (from, to) in [
            ("stores-redis", "rollout-redis"),
            ("stores-postgres", "rollout-postgres"),
            ("stores-minio", "rollout-s3"),
        ] {
            let data = secrets.get(from).await.expect("store secret").data;
            let data = data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            create_secret(&client, &ns, to, data).await;
        }
        ns
    })
    .await
}

const STORES: &str = "\
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata:
  name: stores
spec:
  image: ghcr.io/acme/support-bot:1.0.0
  replicas: 0
";

/// An AgentDeployment on the shared stores.
fn deployment(name: &str, replicas: u32, image: &str, extra: &str) -> String {
    format!(
        "\
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata:
  name: {name}
spec:
  image: {image}
  replicas: {replicas}
  dependencies:
    redis: {{external: {{secretRef: {{name: rollout-redis}}}}}}
    postgres: {{external: {{secretRef: {{name: rollout-postgres}}}}}}
    objectStore: {{external: {{secretRef: {{name: rollout-s3}}, bucket: baton-workspaces, forcePathStyle: true}}}}
{extra}"
    )
}

/// A `baton operator` for `ns` with its own leader election Lease `id`.
fn operator(ns: &str, id: &str) -> Operator {
    namespaced_operator_with_lease(control_plane(), ns, id)
}

/// What each test starts from: its turn (the tests share one namespace and
/// run one at a time), the control plane, and an operator of its own whose
/// leader election Lease is named after the deployment `name`.
struct Scene {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    ns: &'static str,
    cp: &'static ControlPlane,
    name: &'static str,
    _operator: Operator,
}

impl Scene {
    async fn start(name: &'static str) -> Self {
        let serial = SERIAL.lock().await;
        let ns = shared_namespace().await;
        Self {
            _serial: serial,
            ns,
            cp: control_plane(),
            name,
            _operator: operator(ns, name),
        }
    }
}

async fn agds(ns: &str) -> Api<AgentDeployment> {
    Api::namespaced(control_plane().admin_client().await, ns)
}

fn rollout_phase(agd: &AgentDeployment) -> Option<RolloutPhase> {
    agd.status.as_ref()?.rollout.as_ref().map(|r| r.phase)
}

/// Every replica ready at the latest spec, the rollout complete.
fn settled(agd: &AgentDeployment, replicas: i32) -> bool {
    let Some(status) = agd.status.as_ref() else {
        return false;
    };
    observed_current(agd)
        && status.ready_replicas == replicas
        && status.rollout.as_ref().is_some_and(|r| {
            r.phase == RolloutPhase::Complete
                && r.updated == replicas
                && r.revision == status.update_revision
        })
}

async fn wait_settled(ns: &str, name: &str, replicas: i32, timeout: Duration) -> AgentDeployment {
    wait_agd(
        ns,
        name,
        &format!("{replicas} ready replicas and the rollout complete"),
        timeout,
        |a| settled(a, replicas),
    )
    .await
}

fn set_image(ns: &str, name: &str, image: &str) {
    let patch = format!(r#"{{"spec":{{"image":"{image}"}}}}"#);
    kubectl_ok(
        control_plane(),
        &["patch", "agd", name, "-n", ns, "--type=merge", "-p", &patch],
        None,
    );
}

/// Every pod deletion in the namespace as it happens: which pod, and
/// whether the rollout had listed it as draining first.
#[derive(Clone, Default)]
struct Deletions(
    Arc<Mutex<Vec<Deletion>>>,
    Arc<Mutex<std::collections::BTreeSet<String>>>,
);

#[derive(Clone, Debug)]
struct Deletion {
    pod: String,
    uid: String,
    at: Instant,
}

/// Stops a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Deletions {
    /// Watches the pods of deployment `name` in `ns`, and the uids its
    /// status lists as draining, until dropped.
    async fn watch(ns: &str, name: &str) -> (Self, tokio::task::JoinHandle<()>) {
        let client = control_plane().admin_client().await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let agds: Api<AgentDeployment> = Api::namespaced(client, ns);
        let config =
            watcher::Config::default().labels(&format!("app.kubernetes.io/instance={name}"));
        let seen = Self::default();
        let (record, marks) = (seen.clone(), seen.1.clone());
        let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let marking = tokio::spawn(async move {
            let mut events = watcher(agds, by_name)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(agd)) = events.next().await {
                let draining = agd.status.and_then(|s| s.rollout).map(|r| r.draining);
                marks
                    .lock()
                    .unwrap()
                    .extend(draining.into_iter().flatten().map(|d| d.uid));
            }
        });
        let task = tokio::spawn(async move {
            let _marking = AbortOnDrop(marking);
            let mut events = watcher(pods, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(pod)) = events.next().await {
                if pod.metadata.deletion_timestamp.is_none() {
                    continue;
                }
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let mut list = record.0.lock().unwrap();
                if list.iter().any(|d| d.uid == uid) {
                    continue;
                }
                list.push(Deletion {
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                    uid,
                    at: Instant::now(),
                });
            }
        });
        (seen, task)
    }

    fn list(&self) -> Vec<Deletion> {
        self.0.lock().unwrap().clone()
    }

    fn assert_all_drained_first(&self) {
        let list = self.list();
        // The status lists a pod before its drain starts, long before it is
        // deleted: every deleted pod's uid was seen there.
        let marks = self.1.lock().unwrap().clone();
        let undrained: Vec<&Deletion> = list.iter().filter(|d| !marks.contains(&d.uid)).collect();
        assert!(
            undrained.is_empty(),
            "pods deleted without a drain first: {undrained:?}"
        );
    }
}

/// `baton bench` through `url` for `seconds`, as a child process; its
/// JSON report when it ends.
struct Bench(tokio::process::Child);

impl Bench {
    fn start(url: &str, prefix: &str, seconds: u32) -> Self {
        let child = tokio::process::Command::new(baton())
            .args(["bench", "--url", url, "--verify", "--json"])
            .args(["--sessions", &SESSIONS.to_string()])
            .args(["--concurrency", &CLIENTS.to_string()])
            .args(["--duration", &format!("{seconds}s")])
            .args(["--session-prefix", prefix])
            // Retries of a turn whose replica went away: a whole drain's worth.
            .args(["--max-retries", "2000"])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("baton bench starts");
        Self(child)
    }

    async fn report(self) -> serde_json::Value {
        let out = self.0.wait_with_output().await.expect("baton bench ends");
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("bench report: {e}\n{text}"))
    }
}

fn count(report: &serde_json::Value, field: &str) -> u64 {
    report[field].as_u64().unwrap_or(0)
}

fn retries(report: &serde_json::Value) -> u64 {
    report["retries"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0)
}

/// No failed turn, every session verified (nothing lost, nothing twice).
fn assert_clean(report: &serde_json::Value, during: &str) {
    assert_eq!(
        count(report, "failed"),
        0,
        "failed turns {during}: {report}"
    );
    assert_eq!(
        report["verifyErrors"].as_array().map(Vec::len),
        Some(0),
        "sessions that lost or repeated a turn {during}: {report}"
    );
    assert_eq!(
        count(report, "verifiedSessions"),
        u64::from(SESSIONS),
        "{report}"
    );
    assert!(count(report, "acknowledged") > 0, "{report}");
}

fn summary(label: &str, report: &serde_json::Value) -> String {
    format!(
        "{label:<38} acknowledged {:>6}  failed {:>3}  lost/duplicated sessions {:>2}  retries {:>5} {}  p50 {:>7.1} ms  p99 {:>8.1} ms",
        count(report, "acknowledged"),
        count(report, "failed"),
        report["verifyErrors"].as_array().map_or(0, Vec::len),
        retries(report),
        report["retries"],
        report["p50Ms"].as_f64().unwrap_or(0.0),
        report["p99Ms"].as_f64().unwrap_or(0.0),
    )
}

/// The admin token the operator created for `name`.
async fn admin_token(ns: &str, name: &str) -> String {
    let client = control_plane().admin_client().await;
    let secrets: Api<Secret> = Api::namespaced(client, ns);
    let secret = secrets
        .get(&format!("{name}-admin"))
        .await
        .expect("admin secret");
    String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn sidecar_status(ns: &str, pod: &str, token: &str) -> Option<serde_json::Value> {
    let ip = node().pod_ip(ns, pod)?;
    http()
        .get(format!("http://{ip}:7071/v1/admin/status"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// A two-minute turn of `session` on `pod`, started in the background;
/// returns once the pod's sidecar reports it running. Its answer (status,
/// body, time taken) comes with the handle.
async fn long_turn(
    ns: &'static str,
    pod: &'static str,
    session: &str,
    token: &str,
) -> tokio::task::JoinHandle<(u16, serde_json::Value, Duration)> {
    let ip = node().pod_ip(ns, pod).unwrap();
    let url = format!("http://{ip}:7070/v1/sessions/{session}/turns");
    let turn = tokio::spawn(async move {
        let started = Instant::now();
        let answer = http()
            .post(url)
            .json(&serde_json::json!({"input": "/sleep 120000", "turnSeq": 1}))
            .timeout(Duration::from_secs(100))
            .send()
            .await
            .expect("the sidecar answers");
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.unwrap_or_default();
        (status, body, started.elapsed())
    });
    baton_testkit::poll_async_every(
        Duration::from_millis(100),
        Duration::from_secs(30),
        &format!("the long turn to run on {pod}"),
        || async move {
            let status = sidecar_status(ns, pod, token).await?;
            (status["inFlight"] == 1).then_some(())
        },
    )
    .await;
    turn
}

/// The events of deployment `name`, oldest first, as `REASON NOTE` lines.
fn events(ns: &str, name: &str) -> String {
    kubectl_ok(
        control_plane(),
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={name}"),
            "-o",
            "custom-columns=REASON:.reason,NOTE:.message",
            "--sort-by=.metadata.creationTimestamp",
        ],
        None,
    )
}

fn pod_uids(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.uid.clone().unwrap_or_default(),
            )
        })
        .collect()
}

async fn replica_pods(ns: &str, name: &str) -> Vec<Pod> {
    let client = control_plane().admin_client().await;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    pods.list(&ListParams::default().labels(&format!(
        "app.kubernetes.io/instance={name},app.kubernetes.io/component=agent"
    )))
    .await
    .unwrap()
    .items
}

#[test]
fn a_release_under_load_fails_loses_and_repeats_no_turn_and_beats_a_plain_rolling_update() {
    run(async {
        let scene = Scene::start("release").await;
        let (ns, cp, name) = (scene.ns, scene.cp, scene.name);
        let client = cp.admin_client().await;
        apply_yaml(cp, ns, &deployment(name, 3, IMAGE_V1, ""));
        let first = wait_settled(ns, name, 3, START).await;
        let first_revision = first.status.unwrap().update_revision;
        let before = pod_uids(&replica_pods(ns, name).await);

        let proxy = ServiceProxy::start(client.clone(), ns, name, "http")
            .await
            .unwrap();
        let steady = Bench::start(&proxy.url(), "steady", 10).report().await;
        assert_clean(&steady, "at steady state");

        let (deletions, _watch) = Deletions::watch(ns, name).await;
        // The load spans the rollout; BATON_ROLLOUT_LOAD_SECS shortens it
        // so that its percentiles are mostly the rollout's (BENCHMARKS.md).
        let load_secs: u32 = std::env::var("BATON_ROLLOUT_LOAD_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(75);
        let load = Bench::start(&proxy.url(), "release", load_secs);
        let started = Instant::now();
        set_image(ns, name, IMAGE_V2);
        let agd = wait_agd(ns, name, "the new revision rolled out", ROLLOUT, |a| {
            settled(a, 3) && a.status.as_ref().unwrap().update_revision != first_revision
        })
        .await;
        let rollout_took = started.elapsed();
        let during = load.report().await;
        let bench_took = started.elapsed();
        assert!(
            rollout_took < bench_took,
            "the load ended before the rollout ({rollout_took:?}); nothing measured its end"
        );
        assert_clean(&during, "during the rollout");

        // Every pod replaced once, highest ordinal first, each drained first.
        deletions.assert_all_drained_first();
        let order: Vec<String> = deletions.list().iter().map(|d| d.pod.clone()).collect();
        assert_eq!(order, ["release-2", "release-1", "release-0"]);
        let deleted_uids: Vec<String> = deletions.list().iter().map(|d| d.uid.clone()).collect();
        for (pod, uid) in &before {
            assert!(deleted_uids.contains(uid), "{pod} was not replaced");
        }
        let status = agd.status.clone().unwrap();
        assert_eq!(status.current_revision, status.update_revision);
        let events = events(ns, name);
        for reason in [
            "Draining",
            "Drained",
            "Deleted",
            "PodReady",
            "RolloutComplete",
        ] {
            assert!(events.contains(reason), "no {reason} event:\n{events}");
        }
        assert!(
            events.contains("turns handed over") || events.contains("turn handed over"),
            "{events}"
        );
        let gaps: Vec<String> = deletions
            .list()
            .windows(2)
            .map(|w| format!("{:.1} s", (w[1].at - w[0].at).as_secs_f64()))
            .collect();

        // The baseline: the same pods as a plain StatefulSet, rolled by the
        // StatefulSet controller (no drain, no handover, no preStop).
        let plain = plain_stateful_set(ns, name).await;
        let plain_proxy = ServiceProxy::start(client.clone(), ns, &plain, "http")
            .await
            .unwrap();
        let plain_load = Bench::start(&plain_proxy.url(), "plain", load_secs);
        let plain_started = Instant::now();
        roll_plain(ns, &plain, IMAGE_V2).await;
        let plain_took = plain_started.elapsed();
        let plain_report = plain_load.report().await;
        delete_plain(ns, &plain).await;

        eprintln!("\nrollout of 3 replicas under load ({SESSIONS} sessions, {CLIENTS} clients):");
        eprintln!("{}", summary("steady state (10 s)", &steady));
        eprintln!(
            "{}",
            summary(&format!("operator rollout ({load_secs} s run)"), &during)
        );
        eprintln!(
            "{}",
            summary(
                &format!("StatefulSet RollingUpdate ({load_secs} s run)"),
                &plain_report
            )
        );
        eprintln!(
            "operator rollout took {:.1} s (between deletions: {}); RollingUpdate took {:.1} s",
            rollout_took.as_secs_f64(),
            gaps.join(", "),
            plain_took.as_secs_f64()
        );
        // Per pod: the drain as the sidecar measured it, and how long the
        // new pod took from its creation to Ready.
        for line in events.lines() {
            if line.starts_with("Drained") || line.starts_with("PodReady") {
                eprintln!(
                    "  {}",
                    line.split_whitespace().collect::<Vec<_>>().join(" ")
                );
            }
        }
        eprintln!();
        kubectl_ok(cp, &["delete", "agd", name, "-n", ns, "--wait=false"], None);
    });
}

/// A copy of the replica StatefulSet of `name` as a plain StatefulSet with
/// `RollingUpdate` and no preStop hooks, and a Service in front of it;
/// returns its name once its pods are ready.
async fn plain_stateful_set(ns: &str, name: &str) -> String {
    let client = control_plane().admin_client().await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let source = sets.get(name).await.unwrap();
    let plain = format!("{name}-plain");
    let labels = BTreeMap::from([("baton-test".to_owned(), plain.clone())]);
    let mut spec = source.spec.unwrap();
    spec.selector.match_labels = Some(labels.clone());
    spec.service_name = Some(plain.clone());
    spec.update_strategy = Some(k8s_openapi::api::apps::v1::StatefulSetUpdateStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: None,
    });
    let template = spec.template.metadata.get_or_insert_default();
    template.labels = Some(labels.clone());
    for container in &mut spec.template.spec.as_mut().unwrap().containers {
        container.lifecycle = None;
        if container.name == "agent" {
            container.image = Some(IMAGE_V1.into());
        }
    }
    let set = StatefulSet {
        metadata: kube::api::ObjectMeta {
            name: Some(plain.clone()),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    sets.create(&PostParams::default(), &set).await.unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": plain},
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": 80, "targetPort": 7070}],
        },
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    wait_plain(ns, &plain, |s| s.ready_replicas == Some(3)).await;
    plain
}

async fn wait_plain(
    ns: &str,
    plain: &str,
    check: impl Fn(&k8s_openapi::api::apps::v1::StatefulSetStatus) -> bool,
) {
    let client = control_plane().admin_client().await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let done = tokio::time::timeout(ROLLOUT, async {
        loop {
            if let Ok(set) = sets.get(plain).await
                && let Some(status) = set.status
                && status.observed_generation >= set.metadata.generation
                && check(&status)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if done.is_err() {
        node().print_pods(ns).await;
        panic!("timed out waiting for StatefulSet {plain}");
    }
}

/// Changes the agent image of the plain StatefulSet and waits until the
/// StatefulSet controller has rolled every pod.
async fn roll_plain(ns: &str, plain: &str, image: &str) {
    let client = control_plane().admin_client().await;
    let sets: Api<StatefulSet> = Api::namespaced(client, ns);
    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": image}]}}}});
    sets.patch(plain, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    wait_plain(ns, plain, |s| {
        s.updated_replicas == Some(3)
            && s.ready_replicas == Some(3)
            && s.current_revision == s.update_revision
    })
    .await;
}

async fn delete_plain(ns: &str, plain: &str) {
    let client = control_plane().admin_client().await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let _ = sets.delete(plain, &DeleteParams::background()).await;
    let services: Api<Service> = Api::namespaced(client, ns);
    let _ = services.delete(plain, &DeleteParams::default()).await;
}

#[test]
fn a_turn_longer_than_the_drain_timeout_is_aborted_and_its_session_moves_on_at_once() {
    run(async {
        let scene = Scene::start("long").await;
        let (ns, cp, name) = (scene.ns, scene.cp, scene.name);
        // The lease TTL is long: a session that waited for it would show.
        let extra = "  session: {drainTimeout: 3s, leaseTtl: 60s}\n";
        apply_yaml(cp, ns, &deployment(name, 2, IMAGE_V1, extra));
        wait_settled(ns, name, 2, START).await;
        let token = admin_token(ns, name).await;
        // long-1 is drained first (highest ordinal).
        let turn = long_turn(ns, "long-1", "slow", &token).await;
        let (deletions, _watch) = Deletions::watch(ns, name).await;
        set_image(ns, name, IMAGE_V2);
        let (status, body, took) = tokio::time::timeout(Duration::from_secs(60), turn)
            .await
            .expect("the long turn ends at the drain timeout")
            .unwrap();
        assert_eq!(
            (status, body["status"].as_str()),
            (503, Some("ABORTED")),
            "{body}"
        );
        assert!(took < Duration::from_secs(60), "{took:?}");
        // Its session goes on on the other replica at once: no lease to wait for.
        let ip0 = node().pod_ip(ns, "long-0").unwrap();
        let started = Instant::now();
        let next: serde_json::Value = http()
            .post(format!("http://{ip0}:7070/v1/sessions/slow/turns?wait=5s"))
            .json(&serde_json::json!({"input": "hello again", "turnSeq": 1}))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(next["status"], "OK", "{next}");
        assert_eq!(next["replica"], "long-0", "{next}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the session waited {:?} for a lease",
            started.elapsed()
        );
        let agd = wait_settled(ns, name, 2, ROLLOUT).await;
        deletions.assert_all_drained_first();
        let events = events(ns, name);
        assert!(events.contains("long-1 drained in"), "{events}");
        assert!(events.contains("1 turn handed over"), "{events}");
        assert_eq!(
            agd.status.unwrap().rollout.unwrap().phase,
            RolloutPhase::Complete
        );
        kubectl_ok(cp, &["delete", "agd", name, "-n", ns, "--wait=false"], None);
    });
}

#[test]
fn a_broken_version_stops_after_one_pod_and_applying_the_old_spec_rolls_back() {
    run(async {
        let scene = Scene::start("broken").await;
        let (ns, cp, name) = (scene.ns, scene.cp, scene.name);
        let extra = "  rollout: {progressDeadline: 10s}\n";
        apply_yaml(cp, ns, &deployment(name, 3, IMAGE_V1, extra));
        let first = wait_settled(ns, name, 3, START).await;
        let first_revision = first.status.unwrap().update_revision;
        let before = pod_uids(&replica_pods(ns, name).await);
        set_image(ns, name, IMAGE_BROKEN);
        let agd = wait_agd(ns, name, "the rollout to stall", ROLLOUT, |a| {
            observed_current(a) && rollout_phase(a) == Some(RolloutPhase::Stalled)
        })
        .await;
        let progressing = condition(&agd, "Progressing").unwrap();
        assert_eq!(
            (progressing.0.as_str(), progressing.1.as_str()),
            ("False", "ProgressDeadlineExceeded"),
            "{progressing:?}"
        );
        assert!(progressing.2.contains("broken-2"), "{progressing:?}");
        assert_eq!(condition(&agd, "Degraded").unwrap().0, "True");
        // Only broken-2 was replaced; the others serve, untouched.
        let now = pod_uids(&replica_pods(ns, name).await);
        assert_ne!(now["broken-2"], before["broken-2"]);
        for pod in ["broken-0", "broken-1"] {
            assert_eq!(now[pod], before[pod], "{pod} was touched");
        }
        assert_eq!(agd.status.as_ref().unwrap().ready_replicas, 2);
        let status = run_baton(&[
            "rollout",
            "status",
            "agd/broken",
            "-n",
            ns,
            "--timeout",
            "5s",
        ]);
        assert!(!status.0, "a stalled rollout is a failure:\n{}", status.1);
        assert!(status.1.contains("stalled"), "{}", status.1);

        // Applying the old spec again rolls back the same way: the
        // StatefulSet reuses the old revision, and only broken-2 is off it.
        set_image(ns, name, IMAGE_V1);
        let back = wait_settled(ns, name, 3, ROLLOUT).await;
        let now = pod_uids(&replica_pods(ns, name).await);
        for pod in ["broken-0", "broken-1"] {
            assert_eq!(now[pod], before[pod], "{pod} was replaced by the rollback");
        }
        assert_eq!(back.status.unwrap().update_revision, first_revision);
        let status = run_baton(&[
            "rollout",
            "status",
            "agd/broken",
            "-n",
            ns,
            "--timeout",
            "30s",
        ]);
        assert!(status.0, "{}", status.1);
        assert!(status.1.contains("successfully rolled out"), "{}", status.1);
        kubectl_ok(cp, &["delete", "agd", name, "-n", ns, "--wait=false"], None);
    });
}

/// Runs `baton` with the control plane's kubeconfig; (success, output).
fn run_baton(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(baton())
        .args(args)
        .env("KUBECONFIG", control_plane().kubeconfig())
        .output()
        .expect("baton runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn an_operator_killed_mid_rollout_is_resumed_by_the_next_leader_and_no_pod_goes_undrained() {
    run(async {
        let _serial = SERIAL.lock().await;
        let ns = shared_namespace().await;
        let cp = control_plane();
        let name = "resume";
        let mut first = operator(ns, "resume");
        let extra = "  session: {drainTimeout: 6s}\n";
        apply_yaml(cp, ns, &deployment(name, 3, IMAGE_V1, extra));
        wait_settled(ns, name, 3, START).await;
        // A long turn on resume-2 keeps its drain going for the drain timeout.
        let token = admin_token(ns, name).await;
        let _turn = long_turn(ns, "resume-2", "held", &token).await;
        let (deletions, _watch) = Deletions::watch(ns, name).await;
        set_image(ns, name, IMAGE_V2);
        // Kill the leader while it drains resume-2.
        wait_agd(ns, name, "resume-2 draining", ROLLOUT, |a| {
            a.status
                .as_ref()
                .and_then(|s| s.rollout.as_ref())
                .is_some_and(|r| r.pod.as_deref() == Some("resume-2"))
        })
        .await;
        first.kill();
        assert!(
            deletions.list().is_empty(),
            "resume-2 was deleted before its drain ended"
        );
        let _second = operator(ns, "resume");
        wait_settled(ns, name, 3, ROLLOUT + Duration::from_secs(30)).await;
        deletions.assert_all_drained_first();
        let list = deletions.list();
        let mut pods: Vec<&str> = list.iter().map(|d| d.pod.as_str()).collect();
        pods.sort();
        assert_eq!(
            pods,
            ["resume-0", "resume-1", "resume-2"],
            "each pod replaced once: {list:?}"
        );
        kubectl_ok(cp, &["delete", "agd", name, "-n", ns, "--wait=false"], None);
    });
}

#[test]
fn pause_stops_between_pods_resume_and_restart_roll_on_and_scale_down_drains_first_under_load() {
    run(async {
        let scene = Scene::start("pause").await;
        let (ns, cp, name) = (scene.ns, scene.cp, scene.name);
        let client = cp.admin_client().await;
        apply_yaml(cp, ns, &deployment(name, 3, IMAGE_V1, ""));
        wait_settled(ns, name, 3, START).await;

        let first = agds(ns).await.get(name).await.unwrap();
        let first_revision = first.status.unwrap().update_revision;
        set_image(ns, name, IMAGE_V2);
        wait_agd(ns, name, "one replica updated", ROLLOUT, |a| {
            let status = a.status.as_ref();
            observed_current(a)
                && status.is_some_and(|s| s.update_revision != first_revision)
                && status.and_then(|s| s.rollout.as_ref()).is_some_and(|r| {
                    r.updated >= 1 && r.revision == status.unwrap().update_revision
                })
        })
        .await;
        let paused = run_baton(&["rollout", "pause", "agd/pause", "-n", ns]);
        assert!(paused.0, "{}", paused.1);
        let agd = wait_agd(ns, name, "the rollout paused", ROLLOUT, |a| {
            observed_current(a) && rollout_phase(a) == Some(RolloutPhase::Paused)
        })
        .await;
        let updated = agd
            .status
            .as_ref()
            .unwrap()
            .rollout
            .as_ref()
            .unwrap()
            .updated;
        assert!((1..3).contains(&updated), "{updated}");
        // Paused means no new drain: nothing moves for a while.
        let still = tokio::time::timeout(
            Duration::from_secs(6),
            wait_agd(ns, name, "", Duration::from_secs(7), |a| {
                let r = a.status.as_ref().and_then(|s| s.rollout.as_ref());
                r.is_some_and(|r| r.updated != updated || r.phase != RolloutPhase::Paused)
            }),
        )
        .await;
        assert!(still.is_err(), "the paused rollout moved on: {still:?}");
        let now = agds(ns).await.get(name).await.unwrap();
        let draining = now.status.and_then(|s| s.rollout).map(|r| r.draining);
        assert!(
            draining.as_ref().is_none_or(Vec::is_empty),
            "a pod is draining while paused: {draining:?}"
        );
        let line = run_baton(&["rollout", "status", "agd/pause", "-n", ns, "--no-watch"]);
        assert!(line.0 && line.1.contains("Paused"), "{}", line.1);
        let resumed = run_baton(&["rollout", "resume", "agd/pause", "-n", ns]);
        assert!(resumed.0, "{}", resumed.1);
        let status = run_baton(&[
            "rollout",
            "status",
            "agd/pause",
            "-n",
            ns,
            "--timeout",
            "4m",
        ]);
        assert!(
            status.0 && status.1.contains("successfully rolled out"),
            "{}",
            status.1
        );

        // restart: a new revision of the same spec, rolled the same way.
        let revision = agd.status.as_ref().unwrap().update_revision.clone();
        let restarted = run_baton(&["rollout", "restart", "agd/pause", "-n", ns]);
        assert!(restarted.0, "{}", restarted.1);
        wait_agd(ns, name, "a new revision rolled out", ROLLOUT, |a| {
            settled(a, 3) && a.status.as_ref().unwrap().update_revision != revision
        })
        .await;

        // Scale 3 -> 1 under load: the removed pods drain first.
        let proxy = ServiceProxy::start(client.clone(), ns, name, "http")
            .await
            .unwrap();
        let (deletions, _watch) = Deletions::watch(ns, name).await;
        let load = Bench::start(&proxy.url(), "scale", 30);
        // Let the load reach every replica first.
        let token = admin_token(ns, name).await;
        baton_testkit::poll_async_every(
            Duration::from_millis(100),
            Duration::from_secs(20),
            "pause-2 serving turns",
            || {
                let token = token.clone();
                async move {
                    let status = sidecar_status(ns, "pause-2", &token).await?;
                    let served: u64 = status["turnLatency"]
                        .as_array()?
                        .iter()
                        .filter_map(|v| v.as_u64())
                        .sum();
                    (served > 0).then_some(())
                }
            },
        )
        .await;
        kubectl_ok(
            cp,
            &["scale", "agd", name, "-n", ns, "--replicas", "1"],
            None,
        );
        wait_settled(ns, name, 1, ROLLOUT).await;
        let report = load.report().await;
        assert_clean(&report, "during the scale-down");
        deletions.assert_all_drained_first();
        let mut removed: Vec<String> = deletions.list().into_iter().map(|d| d.pod).collect();
        removed.sort();
        assert_eq!(removed, ["pause-1", "pause-2"]);
        eprintln!("{}", summary("scale 3 -> 1 (30 s run)", &report));
        kubectl_ok(cp, &["delete", "agd", name, "-n", ns, "--wait=false"], None);
    });
}

#[test]
fn a_sidecar_of_another_data_layout_is_refused_until_the_spec_migrates() {
    run(async {
        let scene = Scene::start("layout").await;
        let (ns, cp, name) = (scene.ns, scene.cp, scene.name);
        apply_yaml(cp, ns, &deployment(name, 2, IMAGE_V1, ""));
        wait_settled(ns, name, 2, START).await;
        let chat = |pod: &'static str, input: &'static str| async move {
            let ip = node().pod_ip(ns, pod).unwrap();
            let answer: serde_json::Value = http()
                .post(format!("http://{ip}:7070/api/chat"))
                .json(&serde_json::json!({"sessionId": "kept", "input": input}))
                .timeout(Duration::from_secs(15))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            answer
        };
        let first = chat("layout-0", "my name is Lin").await;
        assert_eq!(first["status"], "OK", "{first}");
        let before = pod_uids(&replica_pods(ns, name).await);

        // A sidecar build that writes another layout: refused, nothing else touched.
        let patch = format!(r#"{{"spec":{{"sidecar":{{"image":"{NEXT_LAYOUT_IMAGE}"}}}}}}"#);
        kubectl_ok(
            cp,
            &["patch", "agd", name, "-n", ns, "--type=merge", "-p", &patch],
            None,
        );
        let agd = wait_agd(ns, name, "the rollout refused", ROLLOUT, |a| {
            observed_current(a) && rollout_phase(a) == Some(RolloutPhase::Stalled)
        })
        .await;
        let progressing = condition(&agd, "Progressing").unwrap();
        assert_eq!(progressing.1, "LayoutIncompatible", "{progressing:?}");
        assert!(progressing.2.contains("layout 3"), "{progressing:?}");
        let now = pod_uids(&replica_pods(ns, name).await);
        assert_eq!(now["layout-0"], before["layout-0"], "layout-0 was touched");
        let token = admin_token(ns, name).await;
        let refused = sidecar_status(ns, "layout-1", &token).await.unwrap();
        assert_eq!(
            (refused["layout"].as_u64(), refused["storeLayout"].as_u64()),
            (Some(3), Some(2)),
            "{refused}"
        );
        let turn = chat("layout-1", "what is my name?").await;
        assert_eq!(
            turn["status"], "LAYOUT_MISMATCH",
            "the new build serves nothing: {turn}"
        );
        let second = chat("layout-0", "what is my name?").await;
        assert_eq!(
            second["reply"], "Your name is Lin.",
            "the old replica serves on: {second}"
        );
        let events = events(ns, name);
        assert!(events.contains("LayoutIncompatible"), "{events}");

        // Migrating: every old replica goes, the new layout takes the stores.
        let patch = r#"{"spec":{"rollout":{"migrateLayout":true}}}"#;
        kubectl_ok(
            cp,
            &["patch", "agd", name, "-n", ns, "--type=merge", "-p", patch],
            None,
        );
        wait_settled(ns, name, 2, ROLLOUT).await;
        let status = sidecar_status(ns, "layout-0", &token).await.unwrap();
        assert_eq!(status["layout"], 3, "{status}");
        assert!(status["storeLayout"].is_null(), "{status}");
        let third = chat("layout-0", "what is my name?").await;
        assert_eq!(
            third["reply"], "Your name is Lin.",
            "the session survived: {third}"
        );
        kubectl_ok(cp, &["delete", "agd", name, "-n", ns, "--wait=false"], None);
    });
}
