//! The test node against a real control plane: one control plane and one
//! node for the whole file (starting them costs about ten seconds), one
//! Kubernetes namespace per test, so the tests run in parallel.

use std::future::Future;
use std::net::IpAddr;
use std::process::Command;
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use baton_testkit::kube::ControlPlane;
use baton_testnode::{ImageTable, NodeConfig, Runner, TestNode};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
});

struct Fixture {
    _control_plane: ControlPlane,
    client: kube::Client,
    node: TestNode,
    work_dir: tempfile::TempDir,
}

/// Images the tests run besides the standard ones: a shell and Python, as
/// host programs.
const SHELL_IMAGE: &str = "busybox:1.36";
const PYTHON_IMAGE: &str = "python:3.12-slim";

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "baton_testnode=info".into()),
            )
            .with_test_writer()
            .try_init();
        let control_plane = ControlPlane::start();
        let work_dir = tempfile::Builder::new()
            .prefix("baton-testnode-")
            .tempdir()
            .expect("temp dir");
        let baton = baton_binary();
        let images = ImageTable::standard(baton)
            .with(SHELL_IMAGE, Runner::Host)
            .with(PYTHON_IMAGE, Runner::Host);
        let (client, node) = RUNTIME.block_on(async {
            let client = control_plane.admin_client().await;
            let config = NodeConfig::new("testnode", work_dir.path(), images);
            let node = TestNode::start(client.clone(), config)
                .await
                .expect("the test node starts");
            (client, node)
        });
        Fixture {
            _control_plane: control_plane,
            client,
            node,
            work_dir,
        }
    })
}

/// The `baton` binary next to the test executable, built first when it is
/// missing (`cargo test -p baton-testnode` does not build other packages'
/// binaries).
fn baton_binary() -> std::path::PathBuf {
    if let Some(path) = baton_testnode::locate_baton_binary() {
        return path;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "baton", "--bin", "baton"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build -p baton --bin baton failed");
    baton_testnode::locate_baton_binary().expect("the baton binary after building it")
}

fn run<F: Future>(test: F) -> F::Output {
    RUNTIME.block_on(test)
}

impl Fixture {
    async fn namespace(&self, name: &str) -> String {
        self.apply::<Namespace>(
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        )
        .await;
        name.to_owned()
    }

    /// Server-side apply of `object` (its kind given by `K`).
    async fn apply<K>(&self, namespace: Option<&str>, object: serde_json::Value) -> K
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
        K::Scope: ApiScope,
    {
        let name = object["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_owned();
        let api: Api<K> = K::Scope::api(self.client.clone(), namespace);
        api.patch(
            &name,
            &PatchParams::apply("node-tests").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {name}: {e}"))
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Every container log of every pod of `namespace`.
    fn logs(&self, namespace: &str) -> String {
        let mut out = String::new();
        let prefix = format!("{namespace}_");
        let mut dirs: Vec<_> = std::fs::read_dir(self.work_dir.path().join("pods"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .collect();
        dirs.sort_by_key(|e| e.file_name());
        for dir in dirs {
            let pod = dir.file_name().to_string_lossy()[prefix.len()..].to_owned();
            out.push_str(&self.node.logs(namespace, &pod));
        }
        out
    }

    /// Polls `attempt` every 50 ms until it yields a value; on timeout
    /// panics with the namespace's pod logs.
    async fn wait<T, F, Fut>(
        &self,
        namespace: &str,
        what: &str,
        timeout: Duration,
        mut attempt: F,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = attempt().await {
                return value;
            }
            if Instant::now() > deadline {
                let pods = self
                    .pods(namespace)
                    .list(&Default::default())
                    .await
                    .map(|l| serde_json::to_string_pretty(&l.items).unwrap_or_default())
                    .unwrap_or_default();
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n--- pods ---\n{pods}\n--- logs ---\n{}",
                    self.logs(namespace)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.pods(namespace).get_opt(name).await.ok().flatten()
    }

    async fn wait_ready(&self, namespace: &str, name: &str) -> Pod {
        self.wait(
            namespace,
            &format!("pod {name} Ready"),
            Duration::from_secs(60),
            || async { self.pod(namespace, name).await.filter(is_ready) },
        )
        .await
    }
}

/// Namespaced or cluster-scoped `Api`.
trait ApiScope {
    fn api<K: Resource<DynamicType = (), Scope = Self>>(
        client: kube::Client,
        ns: Option<&str>,
    ) -> Api<K>;
}
impl ApiScope for k8s_openapi::NamespaceResourceScope {
    fn api<K: Resource<DynamicType = (), Scope = Self>>(
        client: kube::Client,
        ns: Option<&str>,
    ) -> Api<K> {
        Api::namespaced(client, ns.expect("a namespace"))
    }
}
impl ApiScope for k8s_openapi::ClusterResourceScope {
    fn api<K: Resource<DynamicType = (), Scope = Self>>(
        client: kube::Client,
        _: Option<&str>,
    ) -> Api<K> {
        Api::all(client)
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `getent hosts name` inside the pod's network namespace: the pod's view
/// of its hosts file.
fn resolve_in_pod(netns: &str, name: &str) -> Option<String> {
    let line = output(Command::new("ip").args(["netns", "exec", netns, "getent", "hosts", name]));
    line.split_whitespace().next().map(str::to_owned)
}

fn redis_ping(ip: IpAddr, password: Option<&str>) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", &ip.to_string(), "--no-auth-warning"]);
    if let Some(pw) = password {
        cmd.args(["-a", pw]);
    }
    output(cmd.arg("ping"))
}

/// A tiny HTTP server on port 8080: answers its HOSTNAME, prints
/// "prestop" when /prestop is asked, "sigterm" (and exits 0) on SIGTERM,
/// and answers /resolve/NAME with the address NAME resolves to (from this
/// long-running process, whose /etc/hosts was bind-mounted at its start).
const PY_SERVER: &str = r#"
import http.server, os, signal, socket, sys
def term(*_):
    print("sigterm", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/prestop":
            print("prestop", flush=True)
        body = os.environ["HOSTNAME"]
        if self.path.startswith("/resolve/"):
            try:
                body = socket.gethostbyname(self.path[len("/resolve/"):])
            except OSError:
                body = "unresolved"
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#;

fn py_pod_spec() -> serde_json::Value {
    json!({
        "terminationGracePeriodSeconds": 20,
        "containers": [{
            "name": "web",
            "image": PYTHON_IMAGE,
            "command": ["python3", "-c", PY_SERVER],
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
            "lifecycle": {"preStop": {"httpGet": {"path": "/prestop", "port": 8080}}},
        }],
    })
}

async fn http_get(ip: IpAddr, port: u16) -> Option<String> {
    http_get_path(ip, port, "/").await
}

async fn http_get_path(ip: IpAddr, port: u16, path: &str) -> Option<String> {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .ok()?
        .get(format!("http://{ip}:{port}{path}"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    response.text().await.ok()
}

#[test]
fn a_redis_statefulset_becomes_ready_and_service_names_resolve_inside_pods() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("redis-sts").await;
        fx.apply::<Service>(Some(&ns), json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "cache"},
            "spec": {"clusterIP": "None", "selector": {"app": "cache"}, "ports": [{"port": 6379}]},
        }))
        .await;
        fx.apply::<StatefulSet>(Some(&ns), json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "cache"},
            "spec": {
                "replicas": 2,
                "serviceName": "cache",
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": "cache"}},
                "template": {
                    "metadata": {"labels": {"app": "cache"}},
                    "spec": {"containers": [{
                        "name": "redis",
                        "image": "redis:7.2.5",
                        "args": ["--save", "", "--appendonly", "yes", "--dir", "/data"],
                        "readinessProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 2},
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }]},
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                }],
            },
        }))
        .await;
        let sets: Api<StatefulSet> = Api::namespaced(fx.client.clone(), &ns);
        fx.wait(&ns, "2 ready replicas", Duration::from_secs(90), || async {
            let sts = sets.get("cache").await.ok()?;
            (sts.status?.ready_replicas == Some(2)).then_some(())
        })
        .await;

        let ip0 = fx.node.pod_ip(&ns, "cache-0").expect("cache-0 has an IP");
        let ip1 = fx.node.pod_ip(&ns, "cache-1").expect("cache-1 has an IP");
        assert_ne!(ip0, ip1);
        assert_eq!(redis_ping(ip0, None), "PONG");
        assert_eq!(redis_ping(ip1, None), "PONG");

        // The claim is bound to a volume of this node, which holds Redis's AOF.
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(fx.client.clone(), &ns);
        let claim = claims
            .get("data-cache-0")
            .await
            .expect("claim data-cache-0");
        assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
        let volumes = std::fs::read_dir(fx.work_dir.path().join("volumes")).expect("volumes dir");
        let has_aof = volumes
            .flatten()
            .filter(|d| {
                d.file_name()
                    .to_string_lossy()
                    .starts_with("redis-sts_data-cache-0_")
            })
            .any(|d| d.path().join("appendonlydir").exists());
        assert!(has_aof, "Redis writes its AOF into the claim's directory");

        // Service names, from inside a pod.
        let netns = fx.node.netns_of(&ns, "cache-0").expect("netns of cache-0");
        let ips = [ip0.to_string(), ip1.to_string()];
        let cache = resolve_in_pod(&netns, "cache").expect("cache resolves");
        assert!(
            ips.contains(&cache),
            "cache → {cache}, not a pod of the service"
        );
        assert_eq!(
            resolve_in_pod(&netns, "cache-1.cache").as_deref(),
            Some(ips[1].as_str())
        );
        assert_eq!(
            resolve_in_pod(&netns, "cache-1.cache.redis-sts.svc.cluster.local").as_deref(),
            Some(ips[1].as_str())
        );
        assert_eq!(resolve_in_pod(&netns, "nothing-here"), None);
        // Pods reach each other by name.
        let pong = output(Command::new("ip").args([
            "netns",
            "exec",
            &netns,
            "redis-cli",
            "-h",
            "cache-1.cache",
            "ping",
        ]));
        assert_eq!(pong, "PONG");
    });
}

#[test]
fn env_from_secrets_and_field_refs_reaches_the_process_with_expansion() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("env").await;
        fx.apply::<Secret>(
            Some(&ns),
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "creds"},
                "stringData": {"password": "hunter2"},
            }),
        )
        .await;
        let script = r#"echo "GREETING=$GREETING"; echo "ARG=$1"; echo "IP=$MY_IP"; echo "NODE=$MY_NODE"; echo "SCRATCH=$SCRATCH"; echo "OPTIONAL=${OPTIONAL-unset}"; echo "LEAK=${CARGO_PKG_NAME-none}"; exec sleep 3600"#;
        fx.apply::<Pod>(Some(&ns), json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "printer"},
            "spec": {
                "containers": [{
                    "name": "main",
                    "image": SHELL_IMAGE,
                    "command": ["sh", "-c", script, "sh", "$(POD_NAME)"],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                        {"name": "OPTIONAL", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "x", "optional": true}}},
                        {"name": "GREETING", "value": "hello $(POD_NAME) pw=$(PASSWORD) $$(LITERAL) $(UNDEFINED)"},
                        {"name": "SCRATCH", "value": "/scratch/file"},
                    ],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            },
        }))
        .await;
        let log = fx.node.log_path(&ns, "printer", "main");
        let text = fx
            .wait(
                &ns,
                "the printer's output",
                Duration::from_secs(30),
                || async {
                    // A line of its own: the node's "exec" line, logged
                    // first, holds the script and so "LEAK=" too.
                    std::fs::read_to_string(&log)
                        .ok()
                        .filter(|t| t.lines().any(|l| l.starts_with("LEAK=")))
                },
            )
            .await;
        let ip = fx.node.pod_ip(&ns, "printer").expect("printer's IP");
        assert!(
            text.contains("GREETING=hello printer pw=hunter2 $(LITERAL) $(UNDEFINED)\n"),
            "{text}"
        );
        assert!(text.contains("ARG=printer\n"), "{text}");
        assert!(text.contains(&format!("IP={ip}\n")), "{text}");
        assert!(text.contains("NODE=testnode\n"), "{text}");
        assert!(text.contains("OPTIONAL=unset\n"), "{text}");
        assert!(
            text.contains("LEAK=none\n"),
            "the test's environment leaked in: {text}"
        );
        let scratch = text
            .lines()
            .find_map(|l| l.strip_prefix("SCRATCH="))
            .expect("SCRATCH line");
        assert!(
            scratch.starts_with(&fx.work_dir.path().display().to_string())
                && scratch.ends_with("/scratch/file"),
            "a path under a mount becomes the volume's host path: {scratch}"
        );

        // An image outside the table cannot be pulled.
        fx.apply::<Pod>(
            Some(&ns),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "unpullable"},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
            }),
        )
        .await;
        let message = fx
            .wait(&ns, "ErrImagePull", Duration::from_secs(30), || async {
                let pod = fx.pod(&ns, "unpullable").await?;
                let waiting = pod.status?.container_statuses?.pop()?.state?.waiting?;
                (waiting.reason.as_deref() == Some("ErrImagePull")).then_some(waiting.message?)
            })
            .await;
        assert!(message.contains("nginx"), "{message}");
    });
}

#[test]
fn a_killed_container_is_restarted_and_the_pod_is_ready_again() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("restart").await;
        fx.apply::<Pod>(
            Some(&ns),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "victim"},
                "spec": {"containers": [{
                    "name": "redis",
                    "image": "redis",
                    "args": ["--save", ""],
                    "readinessProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 1},
                    "livenessProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 10},
                }]},
            }),
        )
        .await;
        fx.wait_ready(&ns, "victim").await;
        let pid = fx.node.pid_of(&ns, "victim", "redis").expect("redis pid");
        baton_testkit::send_signal(pid, "KILL");
        let pod = fx
            .wait(
                &ns,
                "restartCount 1 and Ready",
                Duration::from_secs(30),
                || async {
                    let pod = fx.pod(&ns, "victim").await?;
                    let status = pod
                        .status
                        .as_ref()?
                        .container_statuses
                        .as_ref()?
                        .first()?
                        .clone();
                    (status.restart_count == 1 && is_ready(&pod)).then_some(pod)
                },
            )
            .await;
        let status = &pod.status.unwrap().container_statuses.unwrap()[0];
        let last = status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("lastState.terminated");
        assert_eq!((last.exit_code, last.signal), (137, Some(9)));
        assert!(
            status
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some()
        );
        let new_pid = fx.node.pid_of(&ns, "victim", "redis").expect("new pid");
        assert_ne!(pid, new_pid);
        assert_eq!(
            redis_ping(fx.node.pod_ip(&ns, "victim").unwrap(), None),
            "PONG"
        );
    });
}

#[test]
fn deletion_runs_prestop_then_sigterm_and_the_statefulset_gets_a_new_pod() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("deletion").await;
        fx.apply::<StatefulSet>(
            Some(&ns),
            json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 1,
                    "serviceName": "web",
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": py_pod_spec()},
                },
            }),
        )
        .await;
        let first = fx.wait_ready(&ns, "web-0").await;
        let first_uid = first.metadata.uid.clone().unwrap();
        let started = Instant::now();
        fx.pods(&ns)
            .delete("web-0", &DeleteParams::default())
            .await
            .expect("delete web-0");
        let second = fx
            .wait(
                &ns,
                "a new, ready web-0",
                Duration::from_secs(60),
                || async {
                    fx.pod(&ns, "web-0")
                        .await
                        .filter(|p| p.metadata.uid.as_ref() != Some(&first_uid) && is_ready(p))
                },
            )
            .await;
        // SIGTERM ended the process at once: the 20 s grace period was not waited out.
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "took {:?}",
            started.elapsed()
        );
        assert_ne!(second.metadata.uid, first.metadata.uid);
        let log = std::fs::read_to_string(fx.node.log_path(&ns, "web-0", "web")).unwrap();
        let order: Vec<&str> = log
            .lines()
            .filter(|l| matches!(*l, "serving" | "prestop" | "sigterm"))
            .collect();
        assert_eq!(order, ["serving", "prestop", "sigterm", "serving"], "{log}");
        let ip = fx.node.pod_ip(&ns, "web-0").expect("new web-0 IP");
        assert_eq!(http_get(ip, 8080).await.as_deref(), Some("web-0"));
    });
}

#[test]
fn two_pods_listen_on_the_same_port() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("ports").await;
        for name in ["left", "right"] {
            fx.apply::<Pod>(
                Some(&ns),
                json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "labels": {"side": name}},
                    "spec": py_pod_spec(),
                }),
            )
            .await;
        }
        for name in ["left", "right"] {
            fx.wait_ready(&ns, name).await;
            let ip = fx.node.pod_ip(&ns, name).expect("IP");
            assert_eq!(http_get(ip, 8080).await.as_deref(), Some(name));
        }

        // A Service created after the pods started resolves in their
        // running processes: the hosts file is rewritten in place.
        let left = fx.node.pod_ip(&ns, "left").unwrap();
        let right = fx.node.pod_ip(&ns, "right").unwrap().to_string();
        assert_eq!(
            http_get_path(left, 8080, "/resolve/right-svc")
                .await
                .as_deref(),
            Some("unresolved")
        );
        fx.apply::<Service>(
            Some(&ns),
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "right-svc"},
                "spec": {"selector": {"side": "right"}, "ports": [{"port": 8080}]},
            }),
        )
        .await;
        fx.wait(
            &ns,
            "right-svc to resolve inside left",
            Duration::from_secs(20),
            || async {
                let answer =
                    http_get_path(left, 8080, "/resolve/right-svc.ports.svc.cluster.local").await?;
                (answer == right).then_some(())
            },
        )
        .await;
    });
}

#[test]
fn probes_drive_readiness_and_a_failing_liveness_probe_restarts_the_container() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("probes").await;
        let exec = |args: &[&str]| json!({"exec": {"command": args}, "periodSeconds": 1, "failureThreshold": 2});
        fx.apply::<Pod>(
            Some(&ns),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "probed"},
                "spec": {
                    "containers": [{
                        "name": "main",
                        "image": SHELL_IMAGE,
                        "command": ["sleep", "3600"],
                        "startupProbe": exec(&["true"]),
                        "readinessProbe": exec(&["test", "-e", "/state/ready"]),
                        "livenessProbe": exec(&["test", "!", "-e", "/state/dead"]),
                        "volumeMounts": [{"name": "state", "mountPath": "/state"}],
                    }],
                    "volumes": [{"name": "state", "emptyDir": {}}],
                },
            }),
        )
        .await;
        let pod = fx
            .wait(
                &ns,
                "the container started",
                Duration::from_secs(30),
                || async {
                    let pod = fx.pod(&ns, "probed").await?;
                    let started = pod
                        .status
                        .as_ref()?
                        .container_statuses
                        .as_ref()?
                        .first()?
                        .started?;
                    started.then_some(pod)
                },
            )
            .await;
        assert!(
            !is_ready(&pod),
            "not ready before the readiness file exists"
        );
        let state = fx.work_dir.path().join(format!(
            "pods/{ns}_probed/{}/volumes/state",
            pod.metadata.uid.unwrap()
        ));
        std::fs::write(state.join("ready"), "").unwrap();
        fx.wait_ready(&ns, "probed").await;

        std::fs::write(state.join("dead"), "").unwrap();
        let pod = fx
            .wait(
                &ns,
                "a restart after the liveness probe failed",
                Duration::from_secs(30),
                || async {
                    let pod = fx.pod(&ns, "probed").await?;
                    let status = pod
                        .status
                        .as_ref()?
                        .container_statuses
                        .as_ref()?
                        .first()?
                        .clone();
                    (status.restart_count >= 1).then_some(status)
                },
            )
            .await;
        std::fs::remove_file(state.join("dead")).unwrap();
        let last = pod
            .last_state
            .and_then(|s| s.terminated)
            .expect("lastState.terminated");
        assert!(
            last.message
                .as_deref()
                .unwrap_or_default()
                .contains("Liveness probe failed"),
            "{last:?}"
        );
        fx.wait_ready(&ns, "probed").await;
    });
}

/// The managed stores exactly as baton-resources renders them for the
/// `managed-dependencies` example (owner references dropped: there is no
/// AgentDeployment object here): Redis with a password, Postgres, MinIO
/// (SeaweedFS) and the bucket Job (curl), through Services and Secrets.
#[test]
fn the_managed_stores_of_an_example_run_and_the_bucket_job_succeeds() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("stores").await;
        let yaml = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../manifests/examples/managed-dependencies.yaml"),
        )
        .expect("example manifest");
        let mut agd = baton_api::parse::from_yaml(&yaml).expect("example parses");
        agd.metadata.namespace = Some(ns.clone());
        let agd = baton_api::validate(&agd).expect("example is valid");
        let creds = baton_resources::Credentials {
            redis_password: "redis-pw".into(),
            postgres_password: "pg-pw".into(),
            object_store_access_key_id: "baton-access".into(),
            object_store_secret_access_key: "baton-secret".into(),
            admin_token: "admin-token-for-tests-0123".into(),
        };
        let redis = baton_resources::stores::redis(&agd, &creds).expect("managed redis");
        let postgres = baton_resources::stores::postgres(&agd, &creds).expect("managed postgres");
        let (minio, job) = baton_resources::stores::minio(&agd, &creds).expect("managed minio");
        let mut names = Vec::new();
        for store in [redis, postgres, minio] {
            fx.apply::<Secret>(Some(&ns), unowned(&store.secret)).await;
            fx.apply::<Service>(Some(&ns), unowned(&store.service))
                .await;
            names.push(store.stateful_set.metadata.name.clone().unwrap());
            fx.apply::<StatefulSet>(Some(&ns), unowned(&store.stateful_set))
                .await;
        }
        let job_name = job.metadata.name.clone().unwrap();
        fx.apply::<Job>(Some(&ns), unowned(&job)).await;

        let pods: Vec<String> = names.iter().map(|n| format!("{n}-0")).collect();
        for pod in &pods {
            fx.wait_ready(&ns, pod).await;
        }
        let jobs: Api<Job> = Api::namespaced(fx.client.clone(), &ns);
        fx.wait(
            &ns,
            "the bucket Job to succeed",
            Duration::from_secs(60),
            || async {
                let job = jobs.get(&job_name).await.ok()?;
                (job.status?.succeeded == Some(1)).then_some(())
            },
        )
        .await;

        // Redis wants its password (expanded from $(REDIS_PASSWORD)).
        let redis_ip = fx.node.pod_ip(&ns, &pods[0]).unwrap();
        assert_eq!(redis_ping(redis_ip, Some("redis-pw")), "PONG");
        assert_ne!(redis_ping(redis_ip, None), "PONG");
        // Postgres: the user, password and database of its Secret, over the pod IP.
        let pg_ip = fx.node.pod_ip(&ns, &pods[1]).unwrap();
        let secret: Secret = Api::namespaced(fx.client.clone(), &ns)
            .get(&names[1])
            .await
            .unwrap();
        let field =
            |k: &str| String::from_utf8(secret.data.as_ref().unwrap()[k].0.clone()).unwrap();
        let one = output(
            Command::new("psql")
                .env("PGPASSWORD", field("password"))
                .args([
                    "-h",
                    &pg_ip.to_string(),
                    "-U",
                    &field("username"),
                    "-d",
                    &field("database"),
                ])
                .args(["-tAc", "SELECT 1"]),
        );
        assert_eq!(one, "1");
        // The bucket exists (HEAD, signed with the MinIO root keys).
        let s3_ip = fx.node.pod_ip(&ns, &pods[2]).unwrap();
        let code = output(Command::new("curl").args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--aws-sigv4",
            "aws:amz:us-east-1:s3",
            "--user",
            "baton-access:baton-secret",
            "-I",
            &format!("http://{s3_ip}:9000/research-workspaces"),
        ]));
        assert_eq!(code, "200");
        // The MinIO readiness probe path went to SeaweedFS's health endpoint.
        let minio_pod = fx.pod(&ns, &pods[2]).await.unwrap();
        let probe = minio_pod.spec.unwrap().containers[0]
            .readiness_probe
            .clone()
            .unwrap();
        assert_eq!(
            probe.http_get.unwrap().path.as_deref(),
            Some("/minio/health/ready")
        );
    });
}

/// A copy of a rendered object as JSON without owner references.
fn unowned<T: Serialize>(object: &T) -> serde_json::Value {
    let mut value = serde_json::to_value(object).expect("serializes");
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("ownerReferences");
    }
    value
}

/// Everything `baton_resources::build` renders for the `minimal` example
/// (stores, bucket Job, the replica StatefulSet with the sidecar and the
/// reference agent) runs on the node: a conversation continues across the
/// two replicas, and a deleted replica drains (preStop on the sidecar),
/// stops and comes back.
#[test]
fn a_whole_agent_deployment_serves_turns_across_replicas() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("system").await;
        let yaml = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../manifests/examples/minimal.yaml"),
        )
        .expect("example manifest");
        let mut agd = baton_api::parse::from_yaml(&yaml).expect("example parses");
        agd.metadata.namespace = Some(ns.clone());
        let agd = baton_api::validate(&agd).expect("example is valid");
        let creds = baton_resources::Credentials {
            redis_password: "redis-pw".into(),
            postgres_password: "pg-pw".into(),
            object_store_access_key_id: "baton-access".into(),
            object_store_secret_access_key: "baton-secret".into(),
            admin_token: "admin-token-for-tests-0123".into(),
        };
        let replicas = agd.names.replicas();
        for object in baton_resources::build(&agd, &creds, &baton_resources::Platform::default())
            .into_objects()
        {
            use baton_resources::ChildObject as O;
            let ns = Some(ns.as_str());
            match &object {
                O::ServiceAccount(o) => drop(
                    fx.apply::<k8s_openapi::api::core::v1::ServiceAccount>(ns, unowned(o))
                        .await,
                ),
                O::Secret(o) => drop(fx.apply::<Secret>(ns, unowned(o)).await),
                O::ConfigMap(o) => drop(
                    fx.apply::<k8s_openapi::api::core::v1::ConfigMap>(ns, unowned(o))
                        .await,
                ),
                O::Service(o) => drop(fx.apply::<Service>(ns, unowned(o)).await),
                O::NetworkPolicy(o) => drop(
                    fx.apply::<k8s_openapi::api::networking::v1::NetworkPolicy>(ns, unowned(o))
                        .await,
                ),
                O::StatefulSet(o) => drop(fx.apply::<StatefulSet>(ns, unowned(o)).await),
                O::Job(o) => drop(fx.apply::<Job>(ns, unowned(o)).await),
                O::PodDisruptionBudget(o) => drop(
                    fx.apply::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(ns, unowned(o))
                        .await,
                ),
            }
        }
        let pod0 = format!("{replicas}-0");
        let pod1 = format!("{replicas}-1");
        fx.wait_ready(&ns, &pod0).await;
        fx.wait_ready(&ns, &pod1).await;

        let chat = |pod: String, input: &'static str| {
            let ip = fx.node.pod_ip(&ns, &pod).expect("replica IP");
            async move {
                let response = reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .unwrap()
                    .post(format!("http://{ip}:7070/api/chat"))
                    .json(&json!({"sessionId": "s-1", "input": input}))
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await
                    .expect("the sidecar answers");
                response
                    .json::<serde_json::Value>()
                    .await
                    .expect("JSON reply")
            }
        };
        let first = chat(pod0.clone(), "my name is Lin").await;
        assert_eq!(first["status"], "OK", "{first}");
        let second = chat(pod1.clone(), "what is my name?").await;
        assert_eq!(second["status"], "OK", "{second}");
        assert_eq!(second["reply"], "Your name is Lin.", "{second}");
        assert_eq!(second["replica"], pod1.as_str(), "{second}");

        // A deleted replica drains (SIGTERM to the sidecar, while the
        // agent's preStop hook waits for the drain) and is replaced.
        let old = fx.pod(&ns, &pod0).await.unwrap().metadata.uid;
        fx.pods(&ns)
            .delete(&pod0, &DeleteParams::default())
            .await
            .expect("delete");
        fx.wait(
            &ns,
            "a new, ready replica 0",
            Duration::from_secs(90),
            || async {
                fx.pod(&ns, &pod0)
                    .await
                    .filter(|p| p.metadata.uid != old && is_ready(p))
            },
        )
        .await;
        let agent_log = std::fs::read_to_string(fx.node.log_path(&ns, &pod0, "agent")).unwrap();
        assert!(
            agent_log.contains("running the preStop hook"),
            "{agent_log}"
        );
        let log = std::fs::read_to_string(fx.node.log_path(&ns, &pod0, "baton")).unwrap();
        assert!(
            log.lines()
                .any(|l| l.contains("draining") && l.contains("SIGTERM")),
            "{log}"
        );
        let third = chat(pod0.clone(), "what is my name?").await;
        assert_eq!(third["reply"], "Your name is Lin.", "{third}");
    });
}

#[test]
fn init_containers_run_first_and_a_pod_that_never_restarts_succeeds() {
    let fx = fixture();
    run(async {
        let ns = fx.namespace("init").await;
        fx.apply::<Pod>(
            Some(&ns),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "once"},
                "spec": {
                    "restartPolicy": "Never",
                    "initContainers": [{
                        "name": "prepare",
                        "image": SHELL_IMAGE,
                        "command": ["sh", "-c", "echo from-init > \"$FILE\""],
                        "env": [{"name": "FILE", "value": "/shared/init.txt"}],
                        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                    }],
                    "containers": [{
                        "name": "main",
                        "image": SHELL_IMAGE,
                        "command": ["sh", "-c", "cat \"$FILE\""],
                        "env": [{"name": "FILE", "value": "/shared/init.txt"}],
                        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                    }],
                    "volumes": [{"name": "shared", "emptyDir": {}}],
                },
            }),
        )
        .await;
        let pod = fx
            .wait(
                &ns,
                "the pod to succeed",
                Duration::from_secs(30),
                || async {
                    let pod = fx.pod(&ns, "once").await?;
                    let phase = pod.status.as_ref()?.phase.clone()?;
                    (phase == "Succeeded").then_some(pod)
                },
            )
            .await;
        let status = pod.status.unwrap();
        let init = &status.init_container_statuses.expect("init statuses")[0];
        let done = init
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("init terminated");
        assert_eq!(
            (done.exit_code, done.reason.as_deref()),
            (0, Some("Completed"))
        );
        let initialized = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Initialized")
            .unwrap();
        assert_eq!(initialized.status, "True");
        let log = std::fs::read_to_string(fx.node.log_path(&ns, "once", "main")).unwrap();
        assert!(log.lines().any(|l| l == "from-init"), "{log}");
    });
}
