//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager),
//! with client-go's timings: a 15 s lease, renewed 5 s before it expires,
//! and a standby that looks at it every 2 s. Only the leader runs the controller; one that loses the Lease stops at
//! once (the process exits and rejoins), so two leaders never apply.

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Lease duration, as client-go's default `LeaseDuration`.
const LEASE_SECONDS: u64 = 15;
/// Renew this long before the Lease expires (client-go renews within its
/// 10 s `RenewDeadline`).
const GRACE_SECONDS: u64 = 5;
/// How often a standby looks at the Lease (client-go's `RetryPeriod`).
const RETRY: Duration = Duration::from_secs(2);

pub async fn lead(
    client: Client,
    namespace: &str,
    lease_name: &str,
    identity: &str,
    metrics: &Metrics,
    controller: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let shutdown = crate::shutdown_signal();
    tokio::pin!(shutdown);
    info!(lease = %format!("{namespace}/{lease_name}"), %identity, "waiting to become the leader");
    // A standby manager sleeps until the Lease it saw expires, so it would
    // miss a Lease released early by a leader that stopped cleanly. Like
    // client-go's `RetryPeriod`, look again every RETRY: a fresh manager
    // reads the Lease and takes it if it is free or expired.
    let (mut is_leader, task) = loop {
        let manager = LeaseManagerBuilder::new(client.clone(), lease_name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(GRACE_SECONDS)
            .build()
            .await
            .with_context(|| format!("leader election Lease {namespace}/{lease_name}"))?;
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
                break (is_leader, task);
            }
            // Not the leader yet: this manager holds nothing; let it go.
            Err(_elapsed) => release(is_leader, task).await,
        }
    };
    info!(%identity, "became the leader");
    metrics.leader.set(1);
    let result = tokio::select! {
        result = controller => result,
        lost = is_leader.wait_for(|leader| !*leader) => {
            lost.context("leader election stopped")?;
            metrics.leader.set(0);
            warn!(%identity, "lost the leader Lease; stopping");
            Err(anyhow::anyhow!("lost the leader Lease"))
        }
        () = &mut shutdown => Ok(()),
    };
    release(is_leader, task).await;
    result
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
