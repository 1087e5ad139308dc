//! The operator's benchmark (not a test: it asserts nothing about time and
//! is ignored by `cargo test`). Run it with `scripts/bench-operator`, which
//! prints the figures for BENCHMARKS.md:
//!
//! - the control plane's own start time (etcd, kube-apiserver,
//!   kube-controller-manager ready) and the CRD's install;
//! - N AgentDeployments (the `minimal` example under N names, one
//!   namespace) created at once, every request in flight together: that
//!   alone is the baseline (the API server storing N objects), then the time
//!   until every resource's status is written for its generation and every
//!   child exists;
//! - the operator's API writes for that, its CPU time and its RSS (current
//!   and peak) at N resources;
//! - a no-op resync of all N: reconciles counted, API writes counted (the
//!   goal is 0), CPU per reconcile.
//!
//! There is no node: the replica pods stay Pending, as the StatefulSet
//! controller creates them (that load on the API server is part of the run).

use baton_e2e::operator_support;

use std::time::{Duration, Instant};

use baton_api::AgentDeployment;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use operator_support::*;

/// Clock ticks per second of /proc/PID/stat's utime and stime.
const TICKS: f64 = 100.0;

fn count() -> usize {
    std::env::var("BATON_BENCH_AGDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// (VmRSS, VmHWM) in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / TICKS
}

/// The `minimal` example under N names.
fn manifests(n: usize) -> Vec<AgentDeployment> {
    let minimal = example("minimal.yaml");
    (0..n)
        .map(|i| {
            let yaml = minimal.replace("name: support-bot", &format!("name: bot-{i:03}"));
            serde_yaml::from_str(&yaml).expect("the minimal example reads as an AgentDeployment")
        })
        .collect()
}

/// Creates every resource at once: one request each, all in flight
/// together (as a GitOps controller or `kubectl apply` in parallel would;
/// a single `kubectl apply` sends them one by one, which measures kubectl).
async fn create_all(api: &Api<AgentDeployment>, resources: Vec<AgentDeployment>) {
    let params = kube::api::PostParams::default();
    let created =
        futures::future::join_all(resources.iter().map(|agd| api.create(&params, agd))).await;
    for result in created {
        result.expect("an AgentDeployment is stored");
    }
}

#[test]
#[ignore = "a benchmark: scripts/bench-operator"]
fn operator_at_scale() {
    let n = count();
    let started = Instant::now();
    let cp = control_plane();
    let control_plane_start = started.elapsed();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = cp.admin_client().await;
        let home = namespace(&client, "baton-system").await;
        let ns = namespace(&client, "bench").await;
        let kubeconfig = operator_credentials(cp, &home, None, None);
        let operator = Operator::start(
            cp,
            OperatorOptions {
                kubeconfig,
                watch_namespace: None,
                lease_namespace: &home,
                identity: "bench",
                extra_args: &["--resync-interval", "30s"],
            },
        );
        baton_testkit::poll_async_every(POLL, CONVERGE, "the operator to lead", || async {
            operator.is_leader().await.then_some(())
        })
        .await;
        let (idle_rss, _) = rss_kib(operator.pid());
        let writes_before = operator.writes().await;
        let cpu_before = cpu_seconds(operator.pid());

        let resources = manifests(n);
        let agds: Api<AgentDeployment> = Api::namespaced(client.clone(), &ns);
        let applying = Instant::now();
        create_all(&agds, resources).await;
        let applied = applying.elapsed();

        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
        // Every resource has its status for its generation, and every
        // child StatefulSet (replicas, Redis, Postgres, MinIO) exists.
        baton_testkit::poll_async_every(
            Duration::from_millis(50),
            Duration::from_secs(300),
            "every resource to converge",
            || async {
                let list = agds.list(&ListParams::default()).await.ok()?;
                let done = list
                    .items
                    .iter()
                    .filter(|a| observed_current(a) && condition(a, "Ready").is_some())
                    .count();
                let children = sets.list(&ListParams::default()).await.ok()?.items.len();
                (done == n && children == 4 * n).then_some(())
            },
        )
        .await;
        let converged = applying.elapsed();
        let cpu_converge = cpu_seconds(operator.pid()) - cpu_before;
        let writes_converge = operator.writes().await - writes_before;
        let (rss, peak) = rss_kib(operator.pid());

        // Let the StatefulSet controller create every pod (each pod event
        // is a reconcile that must not write), then count one resync of all.
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        baton_testkit::poll_async_every(
            Duration::from_millis(200),
            Duration::from_secs(300),
            "every pod to be created",
            || async {
                let n_pods = pods.list(&ListParams::default()).await.ok()?.items.len();
                (n_pods >= 5 * n).then_some(())
            },
        )
        .await;
        let reconciles = || operator.counter("baton_operator_reconciles_total");
        // A quiet moment: no reconcile for a second.
        let mut last = reconciles().await;
        let quiet_deadline = Instant::now() + Duration::from_secs(120);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = reconciles().await;
            if now == last || Instant::now() > quiet_deadline {
                break;
            }
            last = now;
        }
        let r0 = reconciles().await;
        let w0 = operator.writes().await;
        let c0 = cpu_seconds(operator.pid());
        baton_testkit::poll_async_every(
            Duration::from_millis(200),
            Duration::from_secs(120),
            "one resync of every resource",
            || async { (reconciles().await >= r0 + n as f64).then_some(()) },
        )
        .await;
        let resync_reconciles = reconciles().await - r0;
        let resync_writes = operator.writes().await - w0;
        let resync_cpu = cpu_seconds(operator.pid()) - c0;

        println!("BENCH agds {n}");
        println!(
            "BENCH control_plane_start_ms {}",
            control_plane_start.as_millis()
        );
        println!("BENCH apply_ms {}", applied.as_millis());
        println!("BENCH converge_ms {}", converged.as_millis());
        println!("BENCH converge_writes {writes_converge}");
        println!("BENCH converge_cpu_ms {:.0}", cpu_converge * 1000.0);
        println!("BENCH idle_rss_kib {idle_rss}");
        println!("BENCH rss_kib {rss}");
        println!("BENCH peak_rss_kib {peak}");
        println!("BENCH resync_reconciles {resync_reconciles}");
        println!("BENCH resync_writes {resync_writes}");
        println!(
            "BENCH resync_cpu_us_per_reconcile {:.0}",
            resync_cpu * 1e6 / resync_reconciles
        );
    });
}
