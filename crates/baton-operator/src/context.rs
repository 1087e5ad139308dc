//! What every reconcile shares (the client, the caches, the recorder, the
//! metrics, the settings, leadership) and how one fails: the types the
//! three stages of a reconcile ([`crate::observe`], [`crate::decide`],
//! [`crate::reconcile`]) have in common, kept apart so no stage imports
//! another's I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use baton_api::AgentDeployment;
use kube::Client;
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use crate::caches::Caches;
use crate::children::{ChildKey, Verified};
use crate::decide::Settings;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::rollout_io::Sidecars;

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub caches: Caches,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The sidecar image for resources that do not name one.
    pub default_sidecar_image: Option<String>,
    /// What decisions depend on: the platform's additions, the resync.
    pub settings: Settings,
    pub verified: Mutex<Verified>,
    pub failures: Mutex<HashMap<ObjectRef<DeserializeGuard<AgentDeployment>>, u32>>,
    /// Calls the sidecars' admin API (drain, handover) during a rollout.
    pub sidecars: Sidecars,
    /// Whether this instance may write (the leader, within its deadline).
    pub leadership: Leadership,
}

impl Context {
    /// Every write to the API server (and every drain of a pod) asks here
    /// first: only a leader within its renewal deadline writes. Counted.
    pub fn write(&self, verb: &'static str) -> Result<(), Error> {
        self.leading(verb)?;
        self.metrics.write(verb);
        Ok(())
    }

    /// The leadership check alone, for acts that are not API writes
    /// (asking a sidecar to drain again).
    pub fn leading(&self, what: &'static str) -> Result<(), Error> {
        if self.leadership.may_write() {
            return Ok(());
        }
        self.metrics.refused_writes.inc();
        warn!(what, "not the leader within its renewal deadline: refused");
        Err(Error::NotLeader)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("applying {child}: {source}")]
    Apply {
        child: ChildKey,
        source: kube::Error,
    },
    #[error("pruning {child}: {source}")]
    Prune {
        child: ChildKey,
        source: kube::Error,
    },
    #[error(
        "the watches of {} have not delivered a first list; is list/watch on them missing from the operator's role (baton operator rbac)?",
        .0.join(", ")
    )]
    WatchNotReady(Vec<&'static str>),
    #[error("this instance is not the leader within its renewal deadline")]
    NotLeader,
}

impl Error {
    /// The `error` label of the reconcile metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kube(_) => "api",
            Self::Apply { .. } => "apply",
            Self::Prune { .. } => "prune",
            Self::WatchNotReady(_) => "watch_not_ready",
            Self::NotLeader => "not_leader",
        }
    }
}
