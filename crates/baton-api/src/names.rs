//! Names of the objects derived from one `AgentDeployment`, and the length
//! limits Kubernetes puts on them. Validation uses the limits so that a name
//! that would make any child invalid is refused before anything is built.

/// Kubernetes' limit on a DNS-1123/1035 label (Service names, label values).
pub const DNS_LABEL_MAX: usize = 63;
/// A StatefulSet's name plus `-<10-char revision hash>` must fit in a label
/// value (the `controller-revision-hash` pod label), so the name is at most 52.
pub const STATEFUL_SET_NAME_MAX: usize = DNS_LABEL_MAX - 11;

/// The kind of object a derived name is given to; it decides the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamedKind {
    StatefulSet,
    Service,
    Job,
}

impl NamedKind {
    pub fn max_len(self) -> usize {
        match self {
            Self::StatefulSet => STATEFUL_SET_NAME_MAX,
            // Job names become the `job-name` pod label value.
            Self::Service | Self::Job => DNS_LABEL_MAX,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::StatefulSet => "StatefulSet",
            Self::Service => "Service",
            Self::Job => "Job",
        }
    }
}

/// Names of every child object, from the `AgentDeployment`'s name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildNames {
    base: String,
}

impl ChildNames {
    pub fn new(base: impl Into<String>) -> Self {
        Self { base: base.into() }
    }

    fn suffixed(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.base)
    }

    /// The replica StatefulSet, the client Service, the ServiceAccount and the PDB.
    pub fn replicas(&self) -> String {
        self.base.clone()
    }
    /// The headless Service giving each replica pod a stable DNS name.
    pub fn headless_service(&self) -> String {
        self.suffixed("headless")
    }
    /// The ConfigMap with the runtime settings.
    pub fn config_map(&self) -> String {
        self.suffixed("config")
    }
    /// StatefulSet, Service and Secret of the managed Redis.
    pub fn redis(&self) -> String {
        self.suffixed("redis")
    }
    /// StatefulSet, Service and Secret of the managed Postgres.
    pub fn postgres(&self) -> String {
        self.suffixed("postgres")
    }
    /// StatefulSet, Service and Secret of the managed MinIO.
    pub fn minio(&self) -> String {
        self.suffixed("minio")
    }
    /// The Secret with the admin token the operator calls the sidecars with.
    pub fn admin_secret(&self) -> String {
        self.suffixed("admin")
    }
    /// The NetworkPolicy of the managed stores (the replicas' has the
    /// replicas' name).
    pub fn stores_network_policy(&self) -> String {
        self.suffixed("stores")
    }
    /// The Job that creates the bucket in the managed MinIO.
    pub fn bucket_job(&self) -> String {
        self.suffixed("minio-bucket")
    }
}
