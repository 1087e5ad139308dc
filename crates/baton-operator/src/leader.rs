//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager),
//! with client-go's lease duration: 15 s, renewed 5 s before it expires.
//! Only the leader runs the controller; one that loses the Lease stops at
//! once (the process exits and rejoins), so two leaders never apply.

use std::future::Future;

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

pub async fn lead(
    client: Client,
    namespace: &str,
    lease_name: &str,
    identity: &str,
    metrics: &Metrics,
    controller: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let manager = LeaseManagerBuilder::new(client, lease_name)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(LEASE_SECONDS)
        .with_grace(GRACE_SECONDS)
        .build()
        .await
        .with_context(|| format!("leader election Lease {namespace}/{lease_name}"))?;
    let (mut is_leader, task) = manager.watch().await;
    info!(lease = %format!("{namespace}/{lease_name}"), %identity, "waiting to become the leader");
    tokio::select! {
        acquired = is_leader.wait_for(|leader| *leader) => { acquired.context("leader election stopped")?; }
        () = crate::shutdown_signal() => return Ok(()),
    }
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
        () = crate::shutdown_signal() => Ok(()),
    };
    // Closing the channel makes the manager release the Lease, so the next
    // leader need not wait for it to expire.
    drop(is_leader);
    if let Ok(Err(error)) = tokio::time::timeout(std::time::Duration::from_secs(3), task)
        .await
        .map(|r| {
            r.map_err(anyhow::Error::from)
                .and_then(|r| r.map(|_| ()).map_err(anyhow::Error::from))
        })
    {
        warn!("releasing the Lease: {error:#}");
    }
    result
}
