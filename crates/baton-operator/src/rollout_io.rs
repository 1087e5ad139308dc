//! The edges of the rollout: reading the replica pods from the cache,
//! asking the sidecars of draining pods how their drain goes, and carrying
//! out what [`crate::rollout::plan`] decided (drain a pod the status lists
//! as draining, hand over and delete a drained one), with an event for
//! every step.
//!
//! The operator calls each sidecar's admin API at the pod's IP (the admin
//! port, which the deployment's NetworkPolicy opens to it) with the
//! deployment's admin token (the `<name>-admin` Secret, which the sidecars
//! read too).

use std::sync::Arc;
use std::time::Duration;

use baton_admin_client::{AdminClient, AdminError, Target};
use baton_api::DrainingPod;
use baton_api::constants::ports;
use baton_views::{Handover, ReplicaStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::rollout::{DrainProbe, LayoutMismatch, ReplicaPod};

/// How long one call to a sidecar may take: the admin API answers at once
/// (a drain is started, not waited for).
const SIDECAR_TIMEOUT: Duration = Duration::from_secs(3);

/// A replica pod and where its sidecar answers.
#[derive(Clone, Debug)]
pub struct LivePod {
    pub pod: ReplicaPod,
    pub ip: Option<String>,
}

/// The pods of the replica StatefulSet `stateful_set` (named
/// `<stateful_set>-<ordinal>`), as the rollout sees them; `draining` is
/// `status.rollout.draining`.
pub fn replica_pods(
    pods: &[Arc<Pod>],
    stateful_set: &str,
    draining: &[DrainingPod],
) -> Vec<LivePod> {
    let prefix = format!("{stateful_set}-");
    let mut out: Vec<LivePod> = pods
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            let ordinal: i32 = name.strip_prefix(&prefix)?.parse().ok()?;
            let status = p.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let uid = p.metadata.uid.clone().unwrap_or_default();
            // By uid: a pod of the same name that replaced it is not draining.
            let drain_started_at = draining
                .iter()
                .find(|d| d.pod == name && d.uid == uid)
                .map(|d| d.since.0);
            Some(LivePod {
                pod: ReplicaPod {
                    name,
                    uid,
                    ordinal,
                    revision: p
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("controller-revision-hash"))
                        .cloned(),
                    ready,
                    terminating: p.metadata.deletion_timestamp.is_some(),
                    created_at: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    drain_started_at,
                },
                ip: status.and_then(|s| s.pod_ip.clone()),
            })
        })
        .collect();
    out.sort_by_key(|p| p.pod.ordinal);
    out
}

/// Calls the sidecars' admin API (through the one client,
/// `baton-admin-client`) at each pod's IP and admin port, naming the
/// operator as the actor.
#[derive(Clone)]
pub struct Sidecars {
    client: AdminClient,
}

impl Default for Sidecars {
    fn default() -> Self {
        Self {
            client: AdminClient::new(baton_serve::CLIENT_POOL_IDLE),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("the pod has no IP yet")]
    NoAddress,
    #[error("{0}")]
    Call(#[from] AdminError),
}

/// The sidecar's log says who drained it.
const ACTOR: &str = "operator (rolling release)";

impl Sidecars {
    fn target<'a>(base: &'a str, token: Option<&'a str>) -> Target<'a> {
        Target {
            base,
            token,
            actor: Some(ACTOR),
            timeout: SIDECAR_TIMEOUT,
        }
    }

    fn base(ip: Option<&str>) -> Result<String, SidecarError> {
        let ip = ip.ok_or(SidecarError::NoAddress)?;
        Ok(baton_admin_client::base_url(ip, ports::SIDECAR_ADMIN))
    }

    pub async fn status(
        &self,
        ip: Option<&str>,
        token: Option<&str>,
    ) -> Result<ReplicaStatus, SidecarError> {
        let base = Self::base(ip)?;
        Ok(self.client.status(Self::target(&base, token)).await?)
    }

    /// Starts a drain; answers at once with the turns in flight.
    pub async fn drain(
        &self,
        ip: Option<&str>,
        token: Option<&str>,
    ) -> Result<ReplicaStatus, SidecarError> {
        let base = Self::base(ip)?;
        Ok(self.client.drain(Self::target(&base, token), false).await?)
    }

    pub async fn handover(
        &self,
        ip: Option<&str>,
        token: Option<&str>,
    ) -> Result<Handover, SidecarError> {
        let base = Self::base(ip)?;
        Ok(self.client.handover(Self::target(&base, token)).await?)
    }

    /// Whether a starting pod of the update revision serves nothing
    /// because the stores hold another data layout than its sidecar writes.
    pub async fn probe_layouts(
        &self,
        pods: &[LivePod],
        update_revision: &str,
        token: Option<&str>,
    ) -> Option<LayoutMismatch> {
        let starting = pods.iter().filter(|p| {
            p.pod.revision.as_deref() == Some(update_revision)
                && !p.pod.ready
                && !p.pod.terminating
                && p.pod.drain_started_at.is_none()
        });
        for pod in starting {
            if let Ok(status) = self.status(pod.ip.as_deref(), token).await
                && let (Some(layout), Some(store_layout)) = (status.layout, status.store_layout)
                && layout != store_layout
            {
                return Some(LayoutMismatch {
                    pod: pod.pod.name.clone(),
                    layout,
                    store_layout,
                });
            }
        }
        None
    }

    /// How the drain of each pod the status lists as draining goes.
    pub async fn probe_drains(
        &self,
        pods: &[LivePod],
        token: Option<&str>,
    ) -> Vec<(String, DrainProbe)> {
        let draining = pods
            .iter()
            .filter(|p| p.pod.drain_started_at.is_some() && !p.pod.terminating);
        let asks = draining.map(|p| async move {
            let probe = match self.status(p.ip.as_deref(), token).await {
                Ok(s) if !s.draining => DrainProbe::NotDraining,
                Ok(s) if s.in_flight == 0 => DrainProbe::Drained {
                    drained_in_ms: s.drained_in_ms,
                    aborted: s.aborted_by_drain,
                },
                Ok(s) => DrainProbe::Draining {
                    in_flight: s.in_flight,
                },
                Err(_) => DrainProbe::Unreachable,
            };
            (p.pod.name.clone(), probe)
        });
        futures::future::join_all(asks).await
    }
}

/// Asks the sidecar of a pod the status lists as draining to drain (the
/// first time, or again); the turns in flight, if it answered.
pub async fn drain_again(sidecars: &Sidecars, pod: &LivePod, token: Option<&str>) -> Option<u64> {
    match sidecars.drain(pod.ip.as_deref(), token).await {
        Ok(status) => Some(status.in_flight),
        Err(error) => {
            // A sidecar that does not answer serves nothing to drain; the
            // rollout goes on once the kubelet agrees it is not ready.
            warn!(pod = %pod.pod.name, %error, "drain request failed");
            None
        }
    }
}

/// Gives back the leases a drained sidecar still holds. Best effort: a
/// sidecar that does not answer holds nothing its heartbeat will not free.
pub async fn hand_over(sidecars: &Sidecars, pod: &LivePod, token: Option<&str>) -> u64 {
    match sidecars.handover(pod.ip.as_deref(), token).await {
        Ok(handover) => {
            if handover.still_held > 0 {
                warn!(pod = %pod.pod.name, still_held = handover.still_held, "leases left to expire with the replica's heartbeat");
            }
            handover.released
        }
        Err(error) => {
            info!(pod = %pod.pod.name, %error, "handover not possible");
            0
        }
    }
}

/// Deletes the pod it was given (not a successor of the same name).
pub async fn delete_pod(client: &Client, namespace: &str, pod: &ReplicaPod) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name, &params).await {
        Ok(_) => Ok(()),
        // Gone already, or a successor has the name: nothing of ours is left.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error),
    }
}
