//! The node's settings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::images::ImageTable;

/// How a [`crate::TestNode`] runs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The Node object's name.
    pub name: String,
    /// Pod directories (logs, emptyDirs, working directories) and volume
    /// directories live here. Made traversable by every user (Postgres runs
    /// as `postgres`).
    pub work_dir: PathBuf,
    /// What each image runs.
    pub images: ImageTable,
    /// Probe periods longer than this are shortened to it (`None`: as
    /// written). Default 1 s, so readiness and liveness react within a
    /// second instead of the 10 s default.
    pub probe_period_cap: Option<Duration>,
    /// Restart back-off: 250 ms, doubled per restart up to this. Default
    /// 4 s (a kubelet goes from 10 s to 5 min).
    pub max_restart_backoff: Duration,
    /// The API server's address on the machine's loopback. When set, pods
    /// reach it as in a cluster: `kubernetes.default.svc` resolves to the
    /// node's bridge address, where the node relays TCP to this address;
    /// containers get `KUBERNETES_SERVICE_HOST`/`_PORT`, and projected
    /// service-account volumes get a real token (TokenRequest), the
    /// cluster's CA and the namespace. `None`: pods cannot reach it.
    pub api_server: Option<std::net::SocketAddr>,
}

impl NodeConfig {
    pub fn new(name: impl Into<String>, work_dir: impl AsRef<Path>, images: ImageTable) -> Self {
        Self {
            name: name.into(),
            work_dir: work_dir.as_ref().to_path_buf(),
            images,
            probe_period_cap: Some(Duration::from_secs(1)),
            max_restart_backoff: Duration::from_secs(4),
            api_server: None,
        }
    }
}
