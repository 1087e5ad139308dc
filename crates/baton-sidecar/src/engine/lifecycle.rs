//! A replica's life around its turns: heartbeats (and what they learn of
//! the stores), drain and handover.

use super::*;

impl<S: TurnStore + 'static> Engine<S> {
    /// Whether the stores answered within the last three heartbeats.
    pub fn stores_answer(&self) -> bool {
        let at = self.store_ok_at_ms.load(Ordering::Relaxed);
        now_ms().saturating_sub(at) <= self.timings.heartbeat_ttl.as_millis() as u64
    }

    /// One heartbeat: marks this process alive for the heartbeat TTL.
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        self.heartbeat_on(&self.store).await
    }

    async fn heartbeat_on(&self, store: &S) -> Result<(), StoreError> {
        let info = baton_session::ReplicaInfo {
            replica: self.replica.clone(),
            started_at_ms: self.started_at_ms,
            draining: self.inflight.is_draining(),
            in_flight: self.inflight.len() as u64,
            build: env!("CARGO_PKG_VERSION").to_owned(),
            oldest_unshipped_ms: store.oldest_unshipped_ms(),
            url: self.advertised_url.clone(),
            layout: Some(self.layout),
        };
        store
            .heartbeat_with(&self.holder, info, self.timings.heartbeat_ttl)
            .await?;
        let held = store.claim_layout(self.layout, self.adopt_layout).await?;
        let before = self.store_layout.swap(held, Ordering::Relaxed);
        if held != self.layout && before != held {
            tracing::error!(
                store_layout = held,
                layout = self.layout,
                "the stores hold another data layout: this replica serves no turn (replicas of two layouts must not share a Redis; see spec.rollout.migrateLayout)"
            );
        }
        self.store_ok_at_ms.store(now_ms(), Ordering::Relaxed);
        Ok(())
    }

    /// Beats through `store` until the process ends. Run it on a thread
    /// of its own with a store connection of its own: the other replicas
    /// take this one's leases when its heartbeat lapses, so nothing a
    /// turn does (a slow disk, a big workspace, a busy connection) may
    /// delay it.
    pub async fn heartbeat_forever(self: Arc<Self>, store: S) {
        let mut tick = tokio::time::interval(self.timings.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.heartbeat_on(&store).await {
                tracing::warn!(replica = %self.holder, error = %e, "heartbeat failed");
            }
        }
    }

    /// Starts draining (once): new turns are refused; running ones get
    /// `drain_timeout` to finish, then are aborted so another replica can
    /// take their sessions. `requested_by` says who asked, for the log.
    pub fn start_drain(self: &Arc<Self>, requested_by: &str) {
        if !self.inflight.start_drain() {
            tracing::info!(replica = %self.replica, requested_by, "drain asked again: already draining");
            return;
        }
        tracing::info!(replica = %self.replica, in_flight = self.inflight.len(), requested_by, "draining");
        let engine = self.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            if !engine
                .inflight
                .wait_empty(engine.timings.drain_timeout)
                .await
            {
                let aborted = engine.inflight.abort_all();
                tracing::warn!(aborted, "drain timeout: aborting the turns still running");
                // Aborted turns release their leases and leave promptly.
                while !engine.inflight.wait_empty(Duration::from_secs(5)).await {
                    engine.inflight.abort_all();
                }
            }
            let ms = started.elapsed().as_millis() as u64;
            engine.inflight.set_drained_in(ms);
            tracing::info!(
                drained_in_ms = ms,
                aborted = engine.inflight.aborted(),
                "drained"
            );
        });
    }

    /// Releases the leases this replica could not give back when their
    /// turns ended (the store did not answer then). Each release is fenced,
    /// so a lease that expired and went to another replica is not touched.
    /// Returns (released, still held).
    pub async fn hand_over(&self) -> (u64, u64) {
        let mut released = 0;
        let mut failed = Vec::new();
        for lease in self.inflight.take_unreleased() {
            match self.timed("abort", self.store.abort(&lease)).await {
                Ok(true) => released += 1,
                // Already expired or taken over: nothing of ours is left.
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, fence = lease.fence, "handover: release failed");
                    failed.push(lease);
                }
            }
        }
        let still_held = failed.len() as u64;
        for lease in failed {
            self.inflight.remember_unreleased(lease);
        }
        (released, still_held)
    }

    /// Longest a drain takes: the drain timeout, then the time aborted
    /// turns take to leave (they release their leases promptly).
    pub fn drain_wait_limit(&self) -> Duration {
        self.timings.drain_timeout + Duration::from_secs(10)
    }

    /// Waits until the drain finished: no turn runs any more.
    pub async fn drained(&self) {
        // The drain task aborts everything at the drain timeout; aborted
        // turns release their leases promptly.
        while !self
            .inflight
            .wait_empty(self.timings.drain_timeout + Duration::from_secs(5))
            .await
        {
            self.inflight.abort_all();
        }
    }
}
