//! Shared by the operator tests: one real control plane per test binary
//! (etcd, kube-apiserver with RBAC, kube-controller-manager), the CRD
//! installed once, a namespace per test, and `baton operator` processes that
//! run with a ServiceAccount token bound to exactly the RBAC that
//! `baton operator rbac` generates.

pub mod node;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use baton_api::AgentDeployment;
use baton_testkit::kube::ControlPlane;
use baton_testkit::{free_port, poll_async_every};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

pub use crate::{CONVERGE, POLL, REPO, baton};

static CONTROL_PLANE: OnceLock<ControlPlane> = OnceLock::new();

/// The control plane of this test binary, with the CRD installed.
pub fn control_plane() -> &'static ControlPlane {
    CONTROL_PLANE.get_or_init(|| {
        let cp = ControlPlane::start();
        kubectl_ok(
            &cp,
            &["apply", "-f", &format!("{REPO}/manifests/crds/")],
            None,
        );
        // `kubectl wait` fails at once on a CRD whose status has no
        // conditions yet, so it is asked again until the deadline.
        let deadline = std::time::Instant::now() + CONVERGE;
        loop {
            let (ok, out) = kubectl(
                &cp,
                &[
                    "wait",
                    "--for=condition=Established",
                    "crd/agentdeployments.baton.dev",
                    "--timeout=60s",
                ],
                None,
            );
            if ok {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the CRD was not Established: {out}"
            );
            std::thread::sleep(POLL);
        }
        cp
    })
}

/// Runs kubectl; returns (success, stdout + stderr).
pub fn kubectl(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut cmd = cp.kubectl();
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl runs");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("kubectl finishes");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

pub fn kubectl_ok(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out) = kubectl(cp, args, stdin);
    assert!(ok, "kubectl {} failed:\n{out}", args.join(" "));
    out
}

/// A fresh namespace for one test.
pub async fn namespace(client: &kube::Client, prefix: &str) -> String {
    let name = format!("{prefix}-{:x}", rand_suffix());
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
    name
}

fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    h.finish() as u32
}

/// Applies the RBAC of `baton operator rbac` (optionally without rule
/// `without_rule`) and returns a kubeconfig holding the ServiceAccount's token.
pub fn operator_credentials(
    cp: &ControlPlane,
    operator_namespace: &str,
    watch_namespace: Option<&str>,
    without_rule: Option<usize>,
) -> PathBuf {
    let yaml = baton_operator::rbac::yaml(&baton_operator::rbac::RbacOptions {
        operator_namespace,
        watch_namespace,
        without_rule,
    })
    .unwrap();
    kubectl_ok(cp, &["apply", "-f", "-"], Some(&yaml));
    let out = kubectl_ok(
        cp,
        &[
            "create",
            "token",
            baton_operator::rbac::NAME,
            "-n",
            operator_namespace,
            "--duration",
            "2h",
        ],
        None,
    );
    let token = out.lines().last().expect("a token");
    let name = format!(
        "{operator_namespace}-{}",
        without_rule
            .map(|r| format!("without-{r}"))
            .unwrap_or_else(|| "operator".into())
    );
    cp.token_kubeconfig(&name, token.trim())
}

/// One `baton operator` process. Killed when dropped; its log is printed
/// when a test panics while it runs.
pub struct Operator {
    child: Option<Child>,
    pub log: PathBuf,
    pub metrics_port: u16,
    pub identity: String,
}

pub struct OperatorOptions<'a> {
    pub kubeconfig: PathBuf,
    pub watch_namespace: Option<&'a str>,
    pub lease_namespace: &'a str,
    pub identity: &'a str,
    /// More `baton operator` flags (e.g. `--resync-interval`).
    pub extra_args: &'a [&'a str],
}

impl Operator {
    pub fn start(cp: &ControlPlane, options: OperatorOptions<'_>) -> Self {
        let log = cp.dir().join(format!("operator-{}.log", options.identity));
        let file = std::fs::File::create(&log).unwrap();
        let metrics_port = free_port();
        // BATON_TEST_OPERATOR_BINARY: another build of `baton` (the bench
        // compares the image's binary with the host build).
        let binary = std::env::var("BATON_TEST_OPERATOR_BINARY").unwrap_or_else(|_| baton().into());
        let mut cmd = Command::new(binary);
        cmd.arg("operator")
            .arg("--kubeconfig")
            .arg(&options.kubeconfig)
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .args(["--leader-election-namespace", options.lease_namespace])
            .args(["--identity", options.identity])
            // BATON_TEST_OPERATOR_LOG overrides the filter when debugging a test.
            .env(
                "RUST_LOG",
                std::env::var("BATON_TEST_OPERATOR_LOG")
                    .unwrap_or_else(|_| "info,baton_operator=debug".into()),
            )
            .env_remove("KUBECONFIG")
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        if let Some(ns) = options.watch_namespace {
            cmd.args(["--namespace", ns]);
        }
        cmd.args(options.extra_args);
        let child = cmd.spawn().expect("baton operator starts");
        Self {
            child: Some(child),
            log,
            metrics_port,
            identity: options.identity.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// kill -9, as a node failure would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The operator's metrics text.
    pub async fn metrics(&self) -> Option<String> {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        reqwest::get(url).await.ok()?.text().await.ok()
    }

    /// Sum of one counter family (`baton_operator_api_writes_total`...).
    pub async fn counter(&self, family: &str) -> f64 {
        let text = self.metrics().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(family))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub async fn writes(&self) -> f64 {
        self.counter("baton_operator_api_writes_total").await
    }

    /// The write count once it stops moving (two reads 500 ms apart
    /// agree): a leader still finishing a reconcile (a status update after
    /// the example got ready) is not taken for a quiet one.
    pub async fn settled_writes(&self) -> f64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut last = self.writes().await;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.writes().await;
            if now == last {
                return now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the operator's writes did not settle within 30 s ({last} then {now})"
            );
            last = now;
        }
    }

    pub async fn is_leader(&self) -> bool {
        self.metrics()
            .await
            .is_some_and(|m| m.lines().any(|l| l == "baton_operator_leader 1"))
    }

    /// Waits for the process to exit by itself; None if it still runs
    /// after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        let child = self.child.as_mut()?;
        while std::time::Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(POLL);
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- operator {} log ----\n{}",
                self.identity,
                self.log_text()
            );
        }
        self.kill();
    }
}

/// An operator for one namespace, with the namespaced RBAC.
pub fn namespaced_operator(cp: &ControlPlane, ns: &str) -> Operator {
    start_namespaced(cp, ns, "op", &[])
}

/// [`namespaced_operator`] electing its leader on the Lease
/// `baton-operator-<id>`, so operators of different ids in one namespace
/// never wait for each other's Lease.
pub fn namespaced_operator_with_lease(cp: &ControlPlane, ns: &str, id: &str) -> Operator {
    let lease = format!("baton-operator-{id}");
    start_namespaced(cp, ns, id, &["--leader-election-id", &lease])
}

fn start_namespaced(cp: &ControlPlane, ns: &str, id: &str, extra_args: &[&str]) -> Operator {
    let kubeconfig = operator_credentials(cp, ns, Some(ns), None);
    Operator::start(
        cp,
        OperatorOptions {
            kubeconfig,
            watch_namespace: Some(ns),
            lease_namespace: ns,
            identity: &format!("{ns}-{id}"),
            extra_args,
        },
    )
}

/// Creates the Secret `name` in `ns` from `(key, value)` pairs, as
/// `kubectl create secret generic --from-literal` would.
pub fn create_secret_literals(cp: &ControlPlane, ns: &str, name: &str, literals: &[(&str, &str)]) {
    let mut args = vec![
        "create".to_owned(),
        "secret".to_owned(),
        "generic".to_owned(),
        name.to_owned(),
        "-n".to_owned(),
        ns.to_owned(),
    ];
    args.extend(
        literals
            .iter()
            .map(|(key, value)| format!("--from-literal={key}={value}")),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kubectl_ok(cp, &args, None);
}

/// Applies a manifest (YAML) into `ns` with kubectl.
pub fn apply_yaml(cp: &ControlPlane, ns: &str, yaml: &str) {
    kubectl_ok(cp, &["apply", "-n", ns, "-f", "-"], Some(yaml));
}

/// An example of `manifests/examples/`, without its namespace (each test
/// has its own).
pub fn example(name: &str) -> String {
    let text = std::fs::read_to_string(format!("{REPO}/manifests/examples/{name}"))
        .expect("example exists");
    text.lines()
        .filter(|l| !l.trim_start().starts_with("namespace:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the resource's status satisfies `check`; returns it.
pub async fn wait_for_agd(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&AgentDeployment) -> bool,
) -> AgentDeployment {
    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), ns);
    poll_async_every(POLL, CONVERGE, what, || {
        let api = api.clone();
        let check = &check;
        async move { api.get_opt(name).await.ok().flatten().filter(|a| check(a)) }
    })
    .await
}

/// The condition of `type_` as (status, reason, message).
pub fn condition(agd: &AgentDeployment, type_: &str) -> Option<(String, String, String)> {
    agd.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub fn observed_current(agd: &AgentDeployment) -> bool {
    agd.status.as_ref().and_then(|s| s.observed_generation) == agd.metadata.generation
}

/// A test's own namespace on the binary's control plane, with an operator
/// watching only it (the namespaced RBAC).
pub struct Scenario {
    pub cp: &'static ControlPlane,
    pub client: kube::Client,
    pub ns: String,
    pub operator: Operator,
}

impl Scenario {
    /// A namespace named after `prefix` and its operator.
    pub async fn new(prefix: &str) -> Self {
        let cp = control_plane();
        let client = cp.admin_client().await;
        let ns = namespace(&client, prefix).await;
        let operator = namespaced_operator(cp, &ns);
        Self {
            cp,
            client,
            ns,
            operator,
        }
    }

    /// Applies `manifests/examples/<file>` into the namespace.
    pub fn apply_example(&self, file: &str) {
        apply_yaml(self.cp, &self.ns, &example(file));
    }

    /// Waits for the operator to write a current status with a Ready
    /// condition on `name`.
    pub async fn converged(&self, name: &str) -> AgentDeployment {
        converged(&self.client, &self.ns, name).await
    }
}

/// A [`Scenario`] with an example applied and converged: the state most
/// operator tests start from.
pub struct Deployed {
    pub cp: &'static ControlPlane,
    pub client: kube::Client,
    pub ns: String,
    pub operator: Operator,
    /// The resource as first converged.
    pub agd: AgentDeployment,
}

impl Deployed {
    /// `manifests/examples/<file>` (whose resource is `name`), converged in
    /// a namespace named after `prefix`.
    pub async fn example(prefix: &str, file: &str, name: &str) -> Self {
        let scenario = Scenario::new(prefix).await;
        scenario.apply_example(file);
        let agd = scenario.converged(name).await;
        let Scenario {
            cp,
            client,
            ns,
            operator,
        } = scenario;
        Self {
            cp,
            client,
            ns,
            operator,
            agd,
        }
    }

    /// The smallest example (`minimal.yaml`: `support-bot`).
    pub async fn minimal(prefix: &str) -> Self {
        Self::example(prefix, "minimal.yaml", "support-bot").await
    }
}

/// Waits for the operator to write a current status with a Ready condition.
pub async fn converged(client: &kube::Client, ns: &str, name: &str) -> AgentDeployment {
    wait_for_agd(
        client,
        ns,
        name,
        "the operator to write a current status",
        |agd| observed_current(agd) && condition(agd, "Ready").is_some(),
    )
    .await
}

/// Waits up to `within` until `name`'s condition `type_` is `True`
/// (`StoresReady` of managed stores: longer than a reconcile, since their
/// pods start).
pub async fn wait_until_true(
    client: &kube::Client,
    ns: &str,
    name: &str,
    type_: &str,
    within: Duration,
) -> AgentDeployment {
    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), ns);
    let what = format!("{name}: {type_}=True");
    poll_async_every(Duration::from_millis(250), within, &what, || {
        let api = api.clone();
        async move {
            let agd = api.get_opt(name).await.ok().flatten()?;
            condition(&agd, type_)
                .is_some_and(|c| c.0 == "True")
                .then_some(agd)
        }
    })
    .await
}
