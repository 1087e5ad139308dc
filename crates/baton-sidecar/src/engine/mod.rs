//! One turn, end to end: begin (lease + state), materialise the workspace,
//! call the agent while renewing the lease, snapshot the workspace, commit.
//! Generic over the store, so the same code runs on Redis + Postgres and on
//! the embedded SQLite backend.
//!
//! - this module: the [`Engine`] (what a replica turns with) and how it is
//!   built; what a turn is asked and answers;
//! - [`turn`]: one turn, from the lease to the commit;
//! - [`lease`]: keeping the lease while the agent runs (renewals, and the
//!   check that hears an interrupt, a takeover or a reader);
//! - [`lifecycle`]: heartbeats, drain and handover;
//! - [`error`]: every way a turn ends without committing.

mod error;
mod lease;
mod lifecycle;
mod turn;

pub use error::TurnError;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_api::agent_contract::TurnRequest;
use baton_session::turn_record::{digest, now_ms};
use baton_session::{
    BeginOutcome, BeginRequest, CommitOutcome, CommitRequest, Lease, ReplicaId, SessionKey,
    StoreError, TurnStore,
};
use baton_workspace::{LocalFiles, Manifest, WorkspaceError, WorkspaceStore};
use bytes::Bytes;
use tracing::Instrument;

use crate::agent_client::{AgentCallError, AgentClient, AgentEvent};
use crate::inflight::{InFlight, Refused};
use crate::live::{Kind, LiveTurn};
pub use crate::local_workspaces::LocalBudget;
use crate::local_workspaces::{Holds, LocalWorkspaces};
use crate::metrics::Metrics;
use crate::outcome::Outcome;

/// The timings a turn runs with.
#[derive(Clone, Debug)]
pub struct Timings {
    pub lease_ttl: Duration,
    pub state_ttl: Duration,
    pub renew_interval: Duration,
    pub drain_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub heartbeat_ttl: Duration,
}

/// A turn the client asked for.
#[derive(Clone, Debug)]
pub struct TurnAsk {
    pub key: SessionKey,
    pub input: String,
    pub turn_seq: Option<u64>,
    /// How long to wait for a busy lease before answering BUSY.
    pub wait: Duration,
    /// Interrupt the turn that holds the session's lease instead of
    /// waiting for it (`?onBusy=interrupt`); then wait at least
    /// [`INTERRUPT_WAIT`] for it to let go.
    pub interrupt: bool,
    /// Where the turn says what it does as it runs (its attempt, the
    /// agent's deltas and progress), for a client that follows it.
    pub live: Option<Arc<LiveTurn>>,
}

/// How long a turn that interrupted another waits, at least, for the
/// lease: a turn interrupted on this replica leaves within
/// [`LEASE_CHECK`].
pub const INTERRUPT_WAIT: Duration = Duration::from_secs(5);

/// How often a running turn asks whether its lease still holds: an
/// interrupted turn (or one taken over) stops within this time, closing its
/// agent's request, rather than at its next renewal. Turns shorter than
/// this never ask.
pub const LEASE_CHECK: Duration = Duration::from_millis(250);

/// A turn's successful answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnAnswer {
    pub reply: String,
    pub turn_seq: u64,
    pub version: u64,
    /// The stored result of a turn that already committed, not a re-run.
    pub duplicate: bool,
}

pub struct Engine<S> {
    pub store: S,
    pub workspaces: WorkspaceStore,
    pub agent: AgentClient,
    /// The replica's name (pod name).
    pub replica: String,
    /// This process's identity in leases and heartbeats: the replica name
    /// plus a per-start suffix, so a replica restarted under the same name
    /// does not revive the dead process's leases with its heartbeat.
    pub holder: ReplicaId,
    pub timings: Timings,
    /// When this process started (Unix ms), for the replica list.
    pub started_at_ms: u64,
    /// Where this sidecar's API answers others (the dashboard), said with
    /// every heartbeat.
    pub advertised_url: Option<String>,
    workspace_root: PathBuf,
    // The rest is shared by the engines of all the replica's runtime
    // threads (see [`Engine::sibling`]).
    pub inflight: Arc<InFlight>,
    /// prometheus-client's metrics share their values when cloned.
    pub metrics: Metrics,
    /// Unix ms of the last heartbeat the stores answered (the first
    /// thread's connection: the others reconnect on their own).
    store_ok_at_ms: Arc<AtomicU64>,
    /// Session directories known to hold exactly a committed version's
    /// files, so the next turn on this replica skips materialising them.
    local: Arc<LocalWorkspaces>,
    /// The data layout this build writes, and whether it may take over
    /// stores that hold another (`--adopt-layout`).
    pub layout: u32,
    adopt_layout: bool,
    /// Whether turn records keep the input and the reply (`--ledger-content
    /// full`), not their digests alone.
    keep_text: bool,
    /// The layout the stores hold, as the last heartbeat read it; 0 until
    /// read. Another than [`Self::layout`]: turns are refused.
    store_layout: Arc<std::sync::atomic::AtomicU32>,
}

impl<S: TurnStore + 'static> Engine<S> {
    pub fn new(
        store: S,
        workspaces: WorkspaceStore,
        agent: AgentClient,
        replica: &str,
        timings: Timings,
        workspace_root: PathBuf,
    ) -> Result<Self, String> {
        let suffix: u32 = rand::random();
        let holder = ReplicaId::new(format!("{replica}-{:06x}", suffix & 0xff_ffff))
            .map_err(|e| format!("replica id: {e}"))?;
        Ok(Self {
            store,
            workspaces,
            agent,
            replica: replica.to_owned(),
            holder,
            timings,
            started_at_ms: now_ms(),
            advertised_url: None,
            workspace_root,
            inflight: Arc::default(),
            metrics: Metrics::default(),
            store_ok_at_ms: Arc::default(),
            local: Arc::new(LocalWorkspaces::new(LocalBudget::default())),
            layout: baton_session::DATA_LAYOUT,
            adopt_layout: false,
            keep_text: true,
            store_layout: Arc::default(),
        })
    }

    /// Sets whether turn records keep what was said (`--ledger-content`).
    pub fn with_ledger_content(mut self, content: baton_api::LedgerContent) -> Self {
        self.keep_text = content == baton_api::LedgerContent::Full;
        self
    }

    /// Sets the data layout this replica says it writes (a test stands in
    /// for another build with it) and whether it may adopt stores that
    /// hold another once no replica of that one is alive.
    pub fn with_layout(mut self, layout: u32, adopt: bool) -> Self {
        self.layout = layout;
        self.adopt_layout = adopt;
        self
    }

    /// The layout the stores hold when it is not this replica's: replicas
    /// of two layouts must not share a Redis, so this one serves nothing.
    pub fn layout_mismatch(&self) -> Option<u32> {
        match self.store_layout.load(Ordering::Relaxed) {
            0 => None,
            store if store == self.layout => None,
            store => Some(store),
        }
    }

    /// Sets how much of the session directories this replica keeps
    /// between turns (see [`LocalBudget`]).
    pub fn with_local_budget(mut self, budget: LocalBudget) -> Self {
        self.local = Arc::new(LocalWorkspaces::new(budget));
        self
    }

    /// Sets the URL said with every heartbeat (see `--advertise-url`).
    pub fn with_advertised_url(mut self, url: Option<String>) -> Self {
        self.advertised_url = url;
        self
    }

    /// Bytes and session directories kept between turns now.
    pub fn local_usage(&self) -> (u64, usize) {
        self.local.usage()
    }

    /// Another engine of the same replica, for another runtime thread: it
    /// brings its own store connection, agent client and workspace store
    /// (their I/O then stays on that thread) and shares everything that
    /// makes the replica one: its identity, the in-flight registry (one
    /// local turn per session, the drain), the metrics, the store health
    /// and the session directories.
    pub fn sibling(&self, store: S, workspaces: WorkspaceStore, agent: AgentClient) -> Self {
        Self {
            store,
            workspaces,
            agent,
            replica: self.replica.clone(),
            holder: self.holder.clone(),
            timings: self.timings.clone(),
            started_at_ms: self.started_at_ms,
            advertised_url: self.advertised_url.clone(),
            workspace_root: self.workspace_root.clone(),
            inflight: self.inflight.clone(),
            metrics: self.metrics.clone(),
            store_ok_at_ms: self.store_ok_at_ms.clone(),
            local: self.local.clone(),
            layout: self.layout,
            adopt_layout: self.adopt_layout,
            keep_text: self.keep_text,
            store_layout: self.store_layout.clone(),
        }
    }

    /// Runs a store step, timing it for the protocol metrics.
    async fn timed<T>(&self, step: &str, f: impl Future<Output = T>) -> T {
        let t = Instant::now();
        let out = f.await;
        self.metrics.protocol(step, t.elapsed());
        out
    }
}
