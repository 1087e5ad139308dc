//! Baton installed the way a platform engineer installs it, on a real
//! control plane (kube-apiserver, kube-controller-manager, etcd) with the
//! test node (`baton-testnode`, the kubelet stand-in: there is no kubelet
//! here) running the pods from the container image itself:
//!
//! - the image (`scripts/build-image`, umoci + skopeo) unpacks to a root
//!   filesystem whose one binary runs alone in it (chroot, as its non-root
//!   user): `baton --version`, `baton crd`;
//! - `helm install` of `charts/baton`: the operator Deployment's pods run
//!   that binary with their in-cluster configuration (the node relays them
//!   to the API server, with their ServiceAccount's bound token, so they
//!   have exactly the chart's RBAC), one becomes leader, and an example
//!   `AgentDeployment` (whose sidecars run the same binary) becomes Ready;
//!   `helm uninstall` removes everything but the CRD and the example's data
//!   volumes;
//! - `kubectl apply -f manifests/install.yaml` does the same.
//!
//! Needs root (the node's network namespaces), helm, umoci and skopeo
//! (`scripts/setup-test-deps`) and the control plane build
//! (`scripts/setup-kubernetes`), and the image built before the test
//! starts: `scripts/test` builds it (`scripts/build-image --profile
//! image-test`) and names it in `BATON_TEST_IMAGE` (`<layout>:<tag>`), so
//! this suite's clock never includes a build.

use baton_e2e::{POLL, REPO};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use baton_api::AgentDeployment;
use baton_testkit::kube::ControlPlane;
use baton_testkit::poll_async_every;
use baton_testnode::{ImageTable, NodeConfig, TestNode};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// An install pulls more than one reconcile does (images unpacked, every
/// chart object created): twice the operator suites' wait.
const INSTALL_CONVERGE: Duration = Duration::from_secs(120);
const RELEASE_NAMESPACE: &str = "baton-system";

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
});

/// The image `scripts/test` built, unpacked once per test binary.
struct Image {
    _dir: tempfile::TempDir,
    /// `<layout>:<tag>`
    reference: String,
    rootfs: PathBuf,
    /// The entrypoint inside the rootfs, e.g. `/usr/local/bin/baton`.
    entrypoint: String,
    /// `uid:gid` of the image's config.
    user: String,
}

static IMAGE: LazyLock<Image> = LazyLock::new(|| {
    let reference = std::env::var("BATON_TEST_IMAGE").expect(
        "BATON_TEST_IMAGE names the image to test (`<layout>:<tag>`): scripts/test builds it, \
         or run `scripts/build-image --profile image-test --out DIR` and set it to what it prints",
    );
    let dir = tempfile::Builder::new()
        .prefix("baton-image-")
        .tempdir()
        .unwrap();
    let bundle = dir.path().join("bundle");
    let out = Command::new("umoci")
        .args(["unpack", "--image", &reference])
        .arg(&bundle)
        .output()
        .expect("umoci runs");
    assert!(
        out.status.success(),
        "umoci unpack: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let entrypoint = config["process"]["args"][0]
        .as_str()
        .expect("an entrypoint")
        .to_owned();
    let user = format!(
        "{}:{}",
        config["process"]["user"]["uid"], config["process"]["user"]["gid"]
    );
    Image {
        reference,
        rootfs: bundle.join("rootfs"),
        entrypoint,
        user,
        _dir: dir,
    }
});

struct Cluster {
    cp: ControlPlane,
    node: TestNode,
    _work_dir: tempfile::TempDir,
}

/// A control plane without Baton's CRD (the chart brings it) and a node
/// that runs Baton's image from the unpacked rootfs.
static CLUSTER: LazyLock<Cluster> = LazyLock::new(|| {
    let binary = IMAGE.rootfs.join(IMAGE.entrypoint.trim_start_matches('/'));
    let cp = ControlPlane::start();
    let work_dir = tempfile::Builder::new()
        .prefix("baton-chart-node-")
        .tempdir()
        .unwrap();
    baton_testkit::remove_on_exit(work_dir.path());
    let node = RUNTIME.block_on(async {
        let client = cp.admin_client().await;
        let mut config = NodeConfig::new("node-0", work_dir.path(), ImageTable::standard(&binary));
        config.api_server = Some(cp.api_address());
        TestNode::start(client, config)
            .await
            .expect("the test node starts")
    });
    Cluster {
        cp,
        node,
        _work_dir: work_dir,
    }
});

fn run_cmd(mut cmd: Command) -> (bool, String) {
    let out = cmd.output().expect("command runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn helm(args: &[&str]) -> String {
    let mut cmd = Command::new("helm");
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(CLUSTER.cp.kubeconfig());
    let (ok, out) = run_cmd(cmd);
    assert!(ok, "helm {}:\n{out}", args.join(" "));
    out
}

fn kubectl(args: &[&str]) -> String {
    let mut cmd = CLUSTER.cp.kubectl();
    cmd.args(args);
    let (ok, out) = run_cmd(cmd);
    assert!(ok, "kubectl {}:\n{out}", args.join(" "));
    out
}

/// Waits until the operator Deployment of release `release` is Ready and
/// one of its pods holds the leader Lease; returns the leader's name.
async fn operator_leads(client: &kube::Client, deployment: &str) -> String {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let ready = poll_async_every(
        POLL,
        INSTALL_CONVERGE,
        "the operator Deployment ready",
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get_opt(deployment).await.ok().flatten()?;
                let status = d.status?;
                (status.ready_replicas == Some(2)).then_some(())
            }
        },
    );
    if tokio::time::timeout(INSTALL_CONVERGE + Duration::from_secs(5), ready)
        .await
        .is_err()
    {
        CLUSTER.node.print_pods(RELEASE_NAMESPACE).await;
        panic!("the operator did not become ready");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    poll_async_every(
        POLL,
        INSTALL_CONVERGE,
        "an operator pod holds the Lease",
        || {
            let (pods, leases) = (pods.clone(), leases.clone());
            async move {
                let holder = leases
                    .get_opt("baton-operator")
                    .await
                    .ok()
                    .flatten()?
                    .spec?
                    .holder_identity?;
                let pod = pods.get_opt(&holder).await.ok().flatten()?;
                pod.metadata.name.filter(|n| n.starts_with(deployment))
            }
        },
    )
    .await
}

/// Applies the example `minimal.yaml` into a new namespace and waits until
/// it is Ready; returns the namespace.
async fn example_becomes_ready(client: &kube::Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    kubectl(&[
        "apply",
        "-n",
        ns,
        "-f",
        &format!("{REPO}/manifests/examples/minimal.yaml"),
    ]);
    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), ns);
    let ready = poll_async_every(
        POLL,
        INSTALL_CONVERGE,
        "the example AgentDeployment Ready",
        || {
            let api = api.clone();
            async move {
                let agd = api.get_opt("support-bot").await.ok().flatten()?;
                let status = agd.status?;
                let ready = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (ready && status.ready_replicas == 2).then_some(())
            }
        },
    );
    if tokio::time::timeout(INSTALL_CONVERGE + Duration::from_secs(5), ready)
        .await
        .is_err()
    {
        CLUSTER.node.print_pods(ns).await;
        CLUSTER.node.print_pods(RELEASE_NAMESPACE).await;
        panic!("the example did not become Ready");
    }
}

/// Deletes the example and waits until its pods are gone; its claims stay.
async fn example_deleted_keeping_its_data(client: &kube::Client, ns: &str) {
    let api: Api<AgentDeployment> = Api::namespaced(client.clone(), ns);
    api.delete("support-bot", &DeleteParams::foreground())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    poll_async_every(POLL, INSTALL_CONVERGE, "the example's pods gone", || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items.is_empty().then_some(())
        }
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let claims = claims.list(&ListParams::default()).await.unwrap();
    assert!(
        claims.items.len() >= 3,
        "the stores' data volumes stay: {:?}",
        claims
            .items
            .iter()
            .map(|c| c.metadata.name.clone())
            .collect::<Vec<_>>()
    );
}

/// The chart's dashboard (no sign-in configured: on its pod's loopback,
/// reached the way `kubectl port-forward` reaches it, from inside the pod's
/// network namespace) lists the example, read with its ServiceAccount.
async fn dashboard_lists(client: &kube::Client, example_namespace: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let listed = poll_async_every(
        POLL,
        INSTALL_CONVERGE,
        "the dashboard lists the example",
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("app.kubernetes.io/component=dashboard"))
                    .await
                    .ok()?;
                let pod = list.items.first()?.metadata.name.clone()?;
                let netns = CLUSTER.node.netns_of(RELEASE_NAMESPACE, &pod)?;
                let out = Command::new("ip")
                    .args(["netns", "exec", &netns, "curl", "-sf", "--max-time", "5"])
                    .arg("http://127.0.0.1:7080/dashboard/replicas")
                    .output()
                    .ok()?;
                let page = String::from_utf8_lossy(&out.stdout).into_owned();
                (page.contains("support-bot") && page.contains(example_namespace)).then_some(page)
            }
        },
    )
    .await;
    assert!(
        listed.contains("Deployments") || listed.contains("AgentDeployment"),
        "{listed}"
    );
}

#[test]
fn the_image_is_self_contained_and_runs_as_non_root() {
    let image = &*IMAGE;
    assert_eq!(image.user, "65532:65532");
    assert_eq!(image.entrypoint, "/usr/local/bin/baton");
    // Nothing but the binary, the CA bundle, passwd/group and two empty
    // directories: no shell, no libc.
    let mut files = Vec::new();
    for entry in walk(&image.rootfs) {
        if entry.is_file() {
            files.push(
                entry
                    .strip_prefix(&image.rootfs)
                    .unwrap()
                    .display()
                    .to_string(),
            );
        }
    }
    files.sort();
    assert_eq!(
        files,
        [
            "etc/group",
            "etc/passwd",
            "etc/ssl/certs/ca-certificates.crt",
            "usr/local/bin/baton"
        ]
    );
    let in_image = |args: &[&str]| {
        // By absolute path: the environment is cleared, PATH too.
        let mut cmd = Command::new("/usr/sbin/chroot");
        cmd.arg("--userspec=65532:65532")
            .arg(&image.rootfs)
            .arg(&image.entrypoint)
            .args(args)
            .env_clear();
        run_cmd(cmd)
    };
    let (ok, version) = in_image(&["--version"]);
    assert!(ok, "{version}");
    assert_eq!(
        version.trim(),
        format!("baton {}", env!("CARGO_PKG_VERSION"))
    );
    let (ok, crd) = in_image(&["crd"]);
    assert!(ok, "{crd}");
    assert_eq!(
        crd,
        std::fs::read_to_string(format!(
            "{REPO}/manifests/crds/agentdeployments.baton.dev.yaml"
        ))
        .unwrap()
    );
    let size: u64 = walk(&image.rootfs)
        .iter()
        .filter(|p| p.is_file())
        .map(|p| p.metadata().unwrap().len())
        .sum();
    println!(
        "image rootfs: {size} bytes ({:.1} MiB) uncompressed",
        size as f64 / 1048576.0
    );
    // The labels follow the OCI annotation keys.
    let (ok, config) = run_cmd({
        let mut cmd = Command::new("skopeo");
        cmd.args(["inspect", "--config", &format!("oci:{}", image.reference)]);
        cmd
    });
    assert!(ok, "{config}");
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let labels = &config["config"]["Labels"];
    for key in ["source", "version", "revision", "licenses"] {
        let key = format!("org.opencontainers.image.{key}");
        assert!(labels[&key].is_string(), "label {key}: {labels}");
    }
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
}

/// The operator of the image, run the way the chart runs it (user 65532,
/// `readOnlyRootFilesystem`) in the image's own root filesystem, here with
/// nothing in it writable by that user (the test node runs processes on the
/// host and cannot enforce a pod's securityContext, so this test does):
/// it leads and reconciles a resource to its status, so nothing it does
/// needs a write to its root filesystem or root's rights.
#[test]
fn the_images_operator_reconciles_as_non_root_on_a_read_only_root_filesystem() {
    let image = &*IMAGE;
    let rootfs = tempfile::Builder::new()
        .prefix("baton-ro-rootfs-")
        .tempdir()
        .unwrap();
    let (ok, out) = run_cmd({
        let mut cmd = Command::new("cp");
        cmd.arg("-a")
            .arg(format!("{}/.", image.rootfs.display()))
            .arg(rootfs.path());
        cmd
    });
    assert!(ok, "{out}");
    let cp = ControlPlane::start();
    // The only file added: the kubeconfig (read-only, certificates inline).
    let kubeconfig = rootfs.path().join("kubeconfig");
    std::fs::copy(cp.kubeconfig(), &kubeconfig).unwrap();
    std::fs::set_permissions(
        &kubeconfig,
        std::os::unix::fs::PermissionsExt::from_mode(0o444),
    )
    .unwrap();
    // Nothing writable by the image's user: /tmp and its home become
    // root's and read-only, as a read-only root filesystem leaves them.
    for dir in ["tmp", "home/nonroot"] {
        let (ok, out) = run_cmd({
            let mut cmd = Command::new("chown");
            cmd.arg("0:0").arg(rootfs.path().join(dir));
            cmd
        });
        assert!(ok, "{out}");
        std::fs::set_permissions(
            rootfs.path().join(dir),
            std::os::unix::fs::PermissionsExt::from_mode(0o555),
        )
        .unwrap();
    }
    for path in walk(rootfs.path()) {
        let mode = std::os::unix::fs::MetadataExt::mode(&path.metadata().unwrap());
        let uid = std::os::unix::fs::MetadataExt::uid(&path.metadata().unwrap());
        assert!(
            uid == 0 && mode & 0o022 == 0,
            "{} is writable by others",
            path.display()
        );
    }
    let (ok, out) = run_cmd({
        let mut cmd = cp.kubectl();
        cmd.args(["apply", "-f"]).arg(format!(
            "{REPO}/manifests/crds/agentdeployments.baton.dev.yaml"
        ));
        cmd
    });
    assert!(ok, "{out}");
    let (ok, out) = run_cmd({
        let mut cmd = cp.kubectl();
        cmd.args([
            "wait",
            "--for",
            "condition=established",
            "crd/agentdeployments.baton.dev",
        ]);
        cmd
    });
    assert!(ok, "{out}");

    let log = rootfs.path().with_extension("log");
    let mut operator = Command::new("/usr/sbin/chroot")
        .arg(format!("--userspec={}", image.user))
        .arg(rootfs.path())
        .arg(&image.entrypoint)
        .args([
            "operator",
            "--kubeconfig",
            "/kubeconfig",
            "--leader-election-namespace",
            "default",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .env_clear()
        .env("RUST_LOG", "info")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let reconciled = RUNTIME.block_on(async {
        let client = cp.admin_client().await;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some("agents-ro".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let example =
            std::fs::read_to_string(format!("{REPO}/manifests/examples/minimal.yaml")).unwrap();
        let agd: AgentDeployment = serde_yaml::from_str(&example).unwrap();
        let agds: Api<AgentDeployment> = Api::namespaced(client.clone(), "agents-ro");
        agds.create(&PostParams::default(), &agd).await.unwrap();
        let deadline = Instant::now() + INSTALL_CONVERGE;
        while Instant::now() < deadline {
            let agd = agds.get("support-bot").await.unwrap();
            let status = agd.status.as_ref();
            if status.is_some_and(|s| s.observed_generation == agd.metadata.generation) {
                let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
                    Api::namespaced(client.clone(), "agents-ro");
                let names: Vec<String> = sets
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .into_iter()
                    .filter_map(|s| s.metadata.name)
                    .collect();
                return Some(names);
            }
            tokio::time::sleep(POLL).await;
        }
        None
    });
    let still_running = operator.try_wait().unwrap().is_none();
    let _ = operator.kill();
    let _ = operator.wait();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let sets =
        reconciled.unwrap_or_else(|| panic!("no status within {INSTALL_CONVERGE:?}:\n{log}"));
    assert!(still_running, "the operator exited:\n{log}");
    assert!(
        sets.iter().any(|s| s == "support-bot"),
        "the replica StatefulSet: {sets:?}\n{log}"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn helm_install_then_install_bundle_reconcile_an_example_to_ready() {
    let cluster = &*CLUSTER;
    RUNTIME.block_on(async {
        let client = cluster.cp.admin_client().await;

        // ---- helm install
        let started = Instant::now();
        helm(&[
            "install",
            "baton",
            &format!("{REPO}/charts/baton"),
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
        ]);
        let leader = operator_leads(&client, "baton-operator").await;
        let operator_ready = started.elapsed();
        example_becomes_ready(&client, "agents-helm").await;
        println!(
            "helm install: operator ready and leading ({leader}) in {:.1} s, example Ready {:.1} s after the install began",
            operator_ready.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        dashboard_lists(&client, "agents-helm").await;
        // The operator runs as its ServiceAccount: its own rights are the
        // chart's, so a reconcile that worked proves them sufficient.
        let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
        let pod = pods.get(&leader).await.unwrap();
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.service_account_name.as_deref()),
            Some("baton-operator")
        );

        // ---- helm uninstall: the CRD and the example's data stay.
        helm(&["uninstall", "baton", "--namespace", RELEASE_NAMESPACE, "--wait"]);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
        let left = deployments.list(&ListParams::default()).await.unwrap();
        assert!(left.items.is_empty(), "Deployments left: {:?}", left.items.len());
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
        assert!(accounts.get_opt("baton-operator").await.unwrap().is_none());
        let roles: Api<ClusterRole> = Api::all(client.clone());
        assert!(roles.get_opt("baton-operator").await.unwrap().is_none());
        assert!(roles.get_opt("baton-dashboard").await.unwrap().is_none());
        let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
        for name in ["baton-operator", "baton-dashboard"] {
            assert!(bindings.get_opt(name).await.unwrap().is_none(), "{name}");
        }
        let services: Api<Service> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
        let left = services.list(&ListParams::default()).await.unwrap();
        assert!(left.items.is_empty(), "Services left: {:?}", left.items.len());
        let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
        let left = budgets.list(&ListParams::default()).await.unwrap();
        assert!(left.items.is_empty(), "PodDisruptionBudgets left: {:?}", left.items.len());
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        assert!(
            crds.get_opt("agentdeployments.baton.dev").await.unwrap().is_some(),
            "Helm keeps the CRD"
        );
        example_deleted_keeping_its_data(&client, "agents-helm").await;
        poll_async_every(POLL, INSTALL_CONVERGE, "the operator pods gone", || {
            let pods = pods.clone();
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?;
                list.items.is_empty().then_some(())
            }
        })
        .await;

        // ---- kubectl apply -f manifests/install.yaml
        let started = Instant::now();
        kubectl(&["apply", "-f", &format!("{REPO}/manifests/install.yaml")]);
        let leader = operator_leads(&client, "baton-operator").await;
        let operator_ready = started.elapsed();
        example_becomes_ready(&client, "agents-bundle").await;
        println!(
            "install.yaml: operator ready and leading ({leader}) in {:.1} s, example Ready {:.1} s after the apply",
            operator_ready.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    });
}
