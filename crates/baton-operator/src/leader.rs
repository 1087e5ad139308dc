//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager),
//! with client-go's timings: a 15 s lease, a 10 s renewal deadline and a
//! 2 s retry period. Only the leader runs the controller.
//!
//! The Lease alone does not stop a leader that cannot renew it (the API
//! server is unreachable, or the process was paused): kube-lease-manager
//! keeps retrying and never reports the loss, and a paused process wakes
//! with reconciles queued. So every API write first asks [`Leadership`],
//! which allows writes only until 10 s after the last renewal this process
//! saw in the Lease, read back every 2 s. The Lease expires 5 s later, and
//! only then may a standby take it: two leaders never write at once (with
//! clocks that agree within those 5 s, as client-go also assumes). A leader
//! past its deadline stops, and its restart rejoins the election.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Lease duration, as client-go's default `LeaseDuration`.
const LEASE_SECONDS: u64 = 15;
/// The leader renews this long before the Lease expires: 7 s after the
/// last renewal, leaving time for retries before the deadline.
const GRACE_SECONDS: u64 = 8;
/// A leader writes only this long after its last renewal (client-go's
/// `RenewDeadline`).
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often a standby looks at the Lease and a leader reads its renewal
/// back (client-go's `RetryPeriod`).
const RETRY: Duration = Duration::from_secs(2);

/// Whether this process may write to the API now.
#[derive(Clone, Debug)]
pub struct Leadership {
    /// `None`: leader election is off (a single instance), always allowed.
    until: Option<Arc<Mutex<Option<Instant>>>>,
}

impl Leadership {
    /// No election: the only instance always writes.
    pub fn unconditional() -> Self {
        Self { until: None }
    }

    fn elected() -> Self {
        Self {
            until: Some(Arc::new(Mutex::new(None))),
        }
    }

    /// True while this process leads within its renewal deadline.
    pub fn may_write(&self) -> bool {
        match &self.until {
            None => true,
            Some(until) => until
                .lock()
                .expect("leadership lock")
                .is_some_and(|until| Instant::now() < until),
        }
    }

    /// A renewal seen at `renewed`: writes are allowed until the deadline
    /// after it (never shortened by an older reading).
    fn renewed(&self, renewed: Instant) {
        if let Some(until) = &self.until {
            let deadline = renewed + RENEW_DEADLINE;
            let mut until = until.lock().expect("leadership lock");
            if until.is_none_or(|u| u < deadline) {
                *until = Some(deadline);
            }
        }
    }

    fn revoke(&self) {
        if let Some(until) = &self.until {
            *until.lock().expect("leadership lock") = None;
        }
    }
}

/// Waits for the Lease, then runs `controller` (built with the returned
/// [`Leadership`]) until shutdown (Ok) or until leadership ends (Err).
pub async fn lead<F, Fut>(
    client: Client,
    namespace: &str,
    lease_name: &str,
    identity: &str,
    metrics: &Metrics,
    controller: F,
) -> anyhow::Result<()>
where
    F: FnOnce(Leadership) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let shutdown = crate::shutdown_signal();
    tokio::pin!(shutdown);
    info!(lease = %format!("{namespace}/{lease_name}"), %identity, "waiting to become the leader");
    // A standby manager sleeps until the Lease it saw expires, so it would
    // miss a Lease released early by a leader that stopped cleanly. Like
    // client-go's `RetryPeriod`, look again every RETRY: a fresh manager
    // reads the Lease and takes it if it is free or expired.
    let (mut is_leader, leadership, task) = loop {
        let manager = LeaseManagerBuilder::new(client.clone(), lease_name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(GRACE_SECONDS)
            .build()
            .await
            .with_context(|| format!("leader election Lease {namespace}/{lease_name}"))?;
        let asked = Instant::now();
        let (mut is_leader, task) = manager.watch().await;
        let acquired = tokio::select! {
            acquired = tokio::time::timeout(RETRY, async {
                is_leader.wait_for(|leader| *leader).await.map(|_| ())
            }) => acquired,
            () = &mut shutdown => {
                release(is_leader, task).await;
                return Ok(());
            }
        };
        match acquired {
            Ok(acquired) => {
                acquired.context("leader election stopped")?;
                // Taken (and renewed) no earlier than we started asking.
                let leadership = Leadership::elected();
                leadership.renewed(asked);
                break (is_leader, leadership, task);
            }
            // Not the leader yet: this manager holds nothing; let it go.
            Err(_elapsed) => release(is_leader, task).await,
        }
    };
    info!(%identity, "became the leader");
    metrics.leader.set(1);
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let result = tokio::select! {
        result = controller(leadership.clone()) => result,
        lost = is_leader.wait_for(|leader| !*leader) => {
            lost.context("leader election stopped")?;
            Err(anyhow::anyhow!("lost the leader Lease"))
        }
        lost = keep_confirming(&leases, lease_name, identity, &leadership) => Err(lost),
        () = &mut shutdown => Ok(()),
    };
    leadership.revoke();
    metrics.leader.set(0);
    if let Err(error) = &result {
        warn!(%identity, writes = metrics.writes(), "{error:#}; stopping");
    }
    release(is_leader, task).await;
    result
}

/// Reads the Lease back every RETRY and moves the write deadline to 10 s
/// after the renewal it shows. Returns why leadership ended: another holder,
/// or no renewal seen within the deadline.
async fn keep_confirming(
    leases: &Api<Lease>,
    lease_name: &str,
    identity: &str,
    leadership: &Leadership,
) -> anyhow::Error {
    let mut every = tokio::time::interval(RETRY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if !leadership.may_write() {
            return anyhow::anyhow!(
                "the leader Lease was not renewed within {} s",
                RENEW_DEADLINE.as_secs()
            );
        }
        let asked = (Instant::now(), SystemTime::now());
        // A failed read proves nothing either way: the deadline decides.
        let Ok(Ok(lease)) = tokio::time::timeout(RETRY, leases.get(lease_name)).await else {
            continue;
        };
        let spec = lease.spec.unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(identity) {
            leadership.revoke();
            return anyhow::anyhow!(
                "the leader Lease is held by {}",
                spec.holder_identity.as_deref().unwrap_or("nobody")
            );
        }
        if let Some(renewed) = spec.renew_time {
            // How long before our read the renewal was, on the wall clock,
            // turned into this process's monotonic clock (which keeps
            // counting while the process is paused).
            let age = asked
                .1
                .duration_since(SystemTime::from(renewed.0))
                .unwrap_or_default();
            if let Some(renewed) = asked.0.checked_sub(age) {
                leadership.renewed(renewed);
            }
        }
    }
}

/// Stops a manager: closing its channel makes it release the Lease if it
/// holds it, so the next leader need not wait for it to expire.
async fn release(
    is_leader: tokio::sync::watch::Receiver<bool>,
    task: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
) {
    drop(is_leader);
    match tokio::time::timeout(Duration::from_secs(3), task).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(error))) => warn!("releasing the Lease: {error:#}"),
        Ok(Err(error)) => warn!("releasing the Lease: {error:#}"),
        Err(_) => warn!("releasing the Lease took over 3 s; it will expire instead"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_allowed_only_within_the_deadline_of_the_latest_renewal() {
        let leadership = Leadership::elected();
        assert!(!leadership.may_write(), "not before the Lease is taken");
        let now = Instant::now();
        leadership.renewed(now);
        assert!(leadership.may_write());
        // An older reading does not shorten the deadline.
        leadership.renewed(now - Duration::from_secs(9));
        assert!(leadership.may_write());
        // A renewal older than the deadline allows nothing.
        let stale = Leadership::elected();
        stale.renewed(now - RENEW_DEADLINE - Duration::from_millis(1));
        assert!(!stale.may_write());
        leadership.revoke();
        assert!(!leadership.may_write());
        assert!(Leadership::unconditional().may_write());
    }
}
