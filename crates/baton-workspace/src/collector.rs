//! The scheduled workspace collector: one replica at a time deletes the
//! workspace manifests and blobs no session can use any more.
//!
//! Every [`CollectorSettings::interval`] each replica tries to take the
//! collector lease; the holder reads the live set from the session store
//! (the workspaces of current states and of the ledger's durable copies)
//! and runs [`WorkspaceStore::collect`], which deletes only what was
//! garbage at its previous run and still is: runs an interval apart, longer
//! than any turn, see every manifest a turn that reused an old blob writes
//! before that blob goes. A replica that takes the lease over starts with
//! nothing to delete, so it too looks twice.

use std::time::Duration;

use crate::{GcCandidates, GcReport, WorkspaceError, WorkspaceStore};
use baton_session::store::{StoreError, WorkspaceRoots};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectorSettings {
    /// Time between runs; longer than the longest turn.
    pub interval: Duration,
    /// Manifests and blobs younger than this are never deleted.
    pub retention: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("reading the live workspaces: {0}")]
    Store(#[from] StoreError),
    #[error("collecting workspaces: {0}")]
    Workspace(#[from] WorkspaceError),
}

pub struct Collector<S> {
    roots: S,
    workspaces: WorkspaceStore,
    holder: String,
    settings: CollectorSettings,
    /// What the previous run of this holder found to be garbage.
    candidates: GcCandidates,
}

impl<S: WorkspaceRoots> Collector<S> {
    pub fn new(
        roots: S,
        workspaces: WorkspaceStore,
        holder: impl Into<String>,
        settings: CollectorSettings,
    ) -> Self {
        Self {
            roots,
            workspaces,
            holder: holder.into(),
            settings,
            candidates: GcCandidates::default(),
        }
    }

    /// The lease outlives two intervals: a holder that stops is replaced
    /// after at most that long.
    fn lease_ttl(&self) -> Duration {
        self.settings.interval * 2 + Duration::from_secs(60)
    }

    /// One run: `None` when another replica holds the lease, otherwise what
    /// this run deleted. A failed run deletes nothing more and forgets its
    /// candidates (the next run only looks).
    pub async fn run_once(&mut self) -> Result<Option<GcReport>, CollectError> {
        if !self
            .roots
            .collector_lease(&self.holder, self.lease_ttl())
            .await?
        {
            self.candidates = GcCandidates::default();
            return Ok(None);
        }
        let previous = std::mem::take(&mut self.candidates);
        let live = self.roots.live_workspaces().await?;
        let (report, next) = self
            .workspaces
            .collect(&live, self.settings.retention, &previous)
            .await?;
        self.candidates = next;
        Ok(Some(report))
    }

    /// Runs every interval until the task is dropped.
    pub async fn run_forever(mut self) {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.run_once().await {
                Ok(Some(report)) => tracing::info!(
                    manifests = report.manifests_deleted,
                    blobs = report.blobs_deleted,
                    waiting = self.candidates.manifests.len() + self.candidates.blobs.len(),
                    "workspace collector run"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "workspace collector run failed"),
            }
        }
    }
}
