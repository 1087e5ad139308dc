//! Keeping a turn's lease while its agent runs: renewals, and the check
//! that hears an interrupt, a takeover or a reader that wants the turn's
//! events.

use super::*;

impl<S: TurnStore + 'static> Engine<S> {
    /// Renews `lease` every renew interval; returns once it is lost. Store
    /// errors are retried until the lease would have expired anyway.
    pub(super) async fn renew_until_lost(&self, lease: &Lease) {
        // Called right after the grant: the lease is fresh now.
        let mut renewed_at = Instant::now();
        loop {
            tokio::time::sleep(self.timings.renew_interval).await;
            match self
                .timed("renew", self.store.renew(lease, self.timings.lease_ttl))
                .await
            {
                Ok(true) => renewed_at = Instant::now(),
                Ok(false) => {
                    tracing::warn!(fence = lease.fence, "lease lost while the agent ran");
                    return;
                }
                Err(e) if renewed_at.elapsed() >= self.timings.lease_ttl => {
                    tracing::warn!(error = %e, "lease expired: renewals failed for a whole TTL");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "renew failed; retrying"),
            }
        }
    }

    /// Returns once `lease` no longer holds, asking every [`LEASE_CHECK`]:
    /// interrupted, or lost (expired, taken over). A store that does not
    /// answer is asked again; the renewals decide when that loses the lease.
    /// The same check says when a reader elsewhere wants the turn's events
    /// (`live`'s copy to the store then starts).
    pub(super) async fn until_lease_goes(
        &self,
        lease: &Lease,
        live: Option<&LiveTurn>,
    ) -> TurnError {
        loop {
            tokio::time::sleep(LEASE_CHECK).await;
            match self.store.check_lease(lease).await {
                Ok(baton_session::LeaseCheck::Held) | Err(_) => {}
                Ok(baton_session::LeaseCheck::Followed) => {
                    if let Some(live) = live {
                        live.want();
                    }
                }
                Ok(baton_session::LeaseCheck::Interrupted) => return TurnError::Interrupted,
                Ok(baton_session::LeaseCheck::Lost) => return TurnError::LeaseLost,
            }
        }
    }
}
