//! A real Kubernetes control plane for the operator tests: etcd,
//! kube-apiserver (Node,RBAC authorization) and kube-controller-manager on
//! free loopback ports, started by `scripts/kube-control-plane` from the
//! binaries `scripts/setup-kubernetes` built and cached. There is no
//! scheduler and no kubelet: `baton-testnode` plays the node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::{on_process_exit, wait_until};

/// The repository's `scripts/` directory.
fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// One control plane, stopped (SIGTERM to its supervisor script, which stops
/// the three processes) when dropped or when the test process exits.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    supervisor: Child,
    /// `https://127.0.0.1:PORT`
    pub api_url: String,
}

impl ControlPlane {
    /// Starts a control plane and waits until it is ready (about 10 s).
    /// Panics with the reason and the logs' location when it cannot.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-k8s-")
            .tempdir()
            .expect("temp dir");
        let log = std::fs::File::create(dir.path().join("supervisor.log")).expect("log file");
        let supervisor = Command::new(scripts_dir().join("kube-control-plane"))
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("scripts/kube-control-plane runs");
        let pid = supervisor.id();
        // The directory too, whether the supervisor is still there or not
        // (a suite's end kills it): a control plane held by a `static` is
        // never dropped (its `TempDir` would remove it).
        on_process_exit(
            &format!(
                "kill -TERM {pid} 2>/dev/null; for i in $(seq 1 100); do kill -0 {pid} 2>/dev/null || break; sleep 0.1; done; rm -rf '{}'",
                dir.path().display()
            ),
            None,
        );
        let ready = dir.path().join("ready");
        let supervisor_log = dir.path().join("supervisor.log");
        let mut this = Self {
            dir,
            supervisor,
            api_url: String::new(),
        };
        wait_until(Duration::from_secs(180), "the control plane", || {
            if let Ok(Some(status)) = this.supervisor.try_wait() {
                panic!(
                    "scripts/kube-control-plane exited ({status}) before it was ready:\n{}",
                    std::fs::read_to_string(&supervisor_log).unwrap_or_default()
                );
            }
            ready.exists()
        });
        this.api_url = this
            .env_value("K8S_API")
            .expect("K8S_API in the control plane's env file");
        this
    }

    /// A value of the control plane's `env` file.
    fn env_value(&self, key: &str) -> Option<String> {
        let env = std::fs::read_to_string(self.dir.path().join("env")).ok()?;
        env.lines().find_map(|line| {
            line.strip_prefix("export ")?
                .strip_prefix(key)?
                .strip_prefix('=')
                .map(|v| v.trim_matches('"').to_owned())
        })
    }

    /// The API server's address on loopback (for a test node's relay,
    /// `NodeConfig::api_server`).
    pub fn api_address(&self) -> std::net::SocketAddr {
        self.api_url
            .trim_start_matches("https://")
            .parse()
            .expect("K8S_API is https://IP:PORT")
    }

    /// The working directory: logs, PKI, etcd data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin kubeconfig (a `system:masters` client certificate).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The CA that signed the apiserver's serving certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("pki/ca.crt")
    }

    /// A client with the admin's rights.
    pub async fn admin_client(&self) -> kube::Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).expect("admin kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("kubeconfig loads");
        kube::Client::try_from(config).expect("client")
    }

    /// Writes a kubeconfig that authenticates with `token` (e.g. a
    /// ServiceAccount's, from the TokenRequest API) and returns its path.
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        let contents = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: baton-test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: baton-test\n  context: {{cluster: baton-test, user: {name}}}\ncurrent-context: baton-test\n",
            self.api_url,
            self.ca_file().display(),
        );
        std::fs::write(&path, contents).expect("kubeconfig written");
        path
    }

    /// kubectl (built with the control plane), pointed at this cluster.
    pub fn kubectl(&self) -> Command {
        let bin = std::env::var_os("KUBE_BIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(kube_bin_dir);
        let mut cmd = Command::new(bin.join("kubectl"));
        cmd.env("KUBECONFIG", self.kubeconfig());
        cmd
    }
}

/// Where `scripts/setup-kubernetes` cached the binaries.
fn kube_bin_dir() -> PathBuf {
    let out = Command::new(scripts_dir().join("setup-kubernetes"))
        .arg("--check")
        .output()
        .expect("scripts/setup-kubernetes runs");
    let env = String::from_utf8_lossy(&out.stdout);
    let dir = env
        .split_whitespace()
        .find_map(|word| word.strip_prefix("KUBE_BIN_DIR="))
        .expect("scripts/setup-kubernetes --check names KUBE_BIN_DIR (run it once to build)");
    PathBuf::from(dir)
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        crate::send_signal(self.supervisor.id(), "TERM");
        let _ = self.supervisor.wait();
    }
}
