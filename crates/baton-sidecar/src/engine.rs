//! One turn, end to end: begin (lease + state), materialise the workspace,
//! call the agent while renewing the lease, snapshot the workspace, commit.
//! Generic over the store, so the same code runs on Redis + Postgres and on
//! the embedded SQLite backend.

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

/// Every way a turn can end without committing. Nothing was written for any
/// of them.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("session {session} is busy: {owner} holds its lease")]
    Busy {
        session: SessionKey,
        owner: String,
        retry_after: Duration,
    },
    #[error("the state moved to version {current_version} under this turn; nothing was written")]
    Conflict { current_version: u64 },
    #[error("this turn lost its lease (expired or taken over); nothing was written")]
    LeaseLost,
    #[error("turnSeq skips ahead: the next one is {next_turn_seq}")]
    Gap { next_turn_seq: u64 },
    #[error(
        "turnSeq is at or below the last committed one ({last_turn_seq}) and its result is no longer kept"
    )]
    Stale { last_turn_seq: u64 },
    #[error(
        "turnSeq {turn_seq} already committed with another input; a retry must send the same input, a new turn the next turnSeq"
    )]
    TurnSeqReused { turn_seq: u64 },
    #[error(
        "the coordination store lost this session's state (the ledger knows version {last_version} and has no copy)"
    )]
    StateLost { last_version: u64 },
    #[error("this replica is draining; retry on another")]
    Draining,
    #[error(
        "this replica writes data layout {layout} but the stores hold layout {store}; it serves no turn (retry on another)"
    )]
    LayoutMismatch { layout: u32, store: u32 },
    #[error(
        "the turn was aborted at the drain timeout; nothing was committed, but the agent may have run"
    )]
    AbortedByDrain,
    #[error(
        "the turn was interrupted (a newer turn on the session asked for it, or a stop); nothing was committed"
    )]
    Interrupted,
    #[error(
        "the store did not answer the commit of turnSeq {turn_seq}: it may or may not have committed; retry with turnSeq {turn_seq} to find out (DUPLICATE if it did)"
    )]
    CommitUnknown { turn_seq: u64 },
    #[error("{0}")]
    Agent(AgentCallError),
    #[error("the agent's new state is not usable: {0}")]
    BadAgentState(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("workspace store: {0}")]
    Workspace(#[from] WorkspaceError),
}

impl TurnError {
    /// The outcome name (docs/design.md, "Outcomes"), for bodies, logs and metrics.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Busy { .. } => Outcome::Busy,
            Self::Conflict { .. } => Outcome::Conflict,
            Self::LeaseLost => Outcome::LeaseLost,
            Self::Gap { .. } => Outcome::Gap,
            Self::Stale { .. } => Outcome::Stale,
            Self::TurnSeqReused { .. } => Outcome::TurnSeqReused,
            Self::StateLost { .. } => Outcome::StateLost,
            Self::Draining => Outcome::Draining,
            Self::LayoutMismatch { .. } => Outcome::LayoutMismatch,
            Self::AbortedByDrain => Outcome::Aborted,
            Self::Interrupted => Outcome::Interrupted,
            Self::CommitUnknown { .. } => Outcome::CommitUnknown,
            Self::Agent(AgentCallError::Timeout(_)) => Outcome::AgentTimeout,
            Self::Agent(AgentCallError::Unreachable(_)) => Outcome::AgentUnavailable,
            Self::Agent(_) | Self::BadAgentState(_) => Outcome::AgentFailed,
            // The agent left files the workspace refuses (too many, too big,
            // names that are not UTF-8): its output, not a store outage.
            Self::Workspace(WorkspaceError::Refused { .. }) => Outcome::AgentFailed,
            Self::Workspace(WorkspaceError::BadManifest(..) | WorkspaceError::Corrupt { .. })
            | Self::Store(StoreError::Corrupt(_)) => Outcome::Corrupt,
            Self::Workspace(WorkspaceError::Io(_)) => Outcome::WorkspaceIo,
            Self::Store(StoreError::TooLarge { .. }) => Outcome::TooLarge,
            Self::Store(StoreError::InvalidId(_)) => Outcome::BadRequest,
            Self::Store(_) | Self::Workspace(_) => Outcome::StoreUnavailable,
        }
    }

    /// A failure of the agent or the stores (worth a log line), not a
    /// refusal the protocol expects (busy, duplicate, draining, bad input).
    pub fn is_fault(&self) -> bool {
        matches!(
            self.outcome(),
            Outcome::AgentTimeout
                | Outcome::AgentUnavailable
                | Outcome::AgentFailed
                | Outcome::Corrupt
                | Outcome::WorkspaceIo
                | Outcome::StoreUnavailable
                | Outcome::StateLost
                | Outcome::CommitUnknown
        )
    }
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

/// What a turn has ready to commit.
struct Prepared {
    reply: String,
    payload: Bytes,
    /// The new manifest's reference, `None` when no file changed.
    workspace: Option<String>,
    manifest: Manifest,
    files: LocalFiles,
    started_at_ms: u64,
}

/// Keeps the lease gauges right however a turn ends.
struct LeaseGauges<'a>(&'a Metrics);

impl<'a> LeaseGauges<'a> {
    fn hold(metrics: &'a Metrics) -> Self {
        metrics.leases_held.inc();
        metrics.in_flight.inc();
        Self(metrics)
    }
}

impl Drop for LeaseGauges<'_> {
    fn drop(&mut self) {
        self.0.leases_held.dec();
        self.0.in_flight.dec();
    }
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

    /// Runs one turn and records its outcome in the metrics.
    pub async fn turn(&self, ask: TurnAsk) -> Result<TurnAnswer, TurnError> {
        let started = Instant::now();
        let span = tracing::info_span!("turn", session = %ask.key, replica = %self.holder);
        let result = self.run(&ask).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(a) if a.duplicate => Outcome::Duplicate,
            Ok(_) => Outcome::Ok,
            Err(e) => e.outcome(),
        }
        .as_str();
        self.metrics
            .turn(&outcome.to_ascii_lowercase(), started.elapsed());
        // A line per turn only at debug: at INFO a busy replica would
        // write megabytes a minute (the metrics count every outcome). What
        // points at a fault of the agent or the stores stays at warn.
        span.in_scope(|| match &result {
            Ok(a) => tracing::debug!(
                outcome,
                version = a.version,
                turn_seq = a.turn_seq,
                ms = started.elapsed().as_millis() as u64,
                "turn answered"
            ),
            Err(e) if e.is_fault() => tracing::warn!(outcome, error = %e, "turn failed"),
            Err(e) => tracing::debug!(outcome, error = %e, "turn refused"),
        });
        result
    }

    async fn timed<T>(&self, step: &str, f: impl Future<Output = T>) -> T {
        let t = Instant::now();
        let out = f.await;
        self.metrics.protocol(step, t.elapsed());
        out
    }

    async fn run(&self, ask: &TurnAsk) -> Result<TurnAnswer, TurnError> {
        if let Some(store) = self.layout_mismatch() {
            return Err(TurnError::LayoutMismatch {
                layout: self.layout,
                store,
            });
        }
        let wait = if ask.interrupt {
            ask.wait.max(INTERRUPT_WAIT)
        } else {
            ask.wait
        };
        let deadline = Instant::now() + wait;
        let mut interrupted = false;
        let input_digest = digest(ask.input.as_bytes());
        let begin = BeginRequest {
            key: ask.key.clone(),
            replica: self.holder.clone(),
            turn_seq: ask.turn_seq,
            cached_version: None,
            lease_ttl: self.timings.lease_ttl,
            state_ttl: self.timings.state_ttl,
            reclaim_own_lease: true,
            input_digest: Some(input_digest.clone()),
        };
        let mut backoff = Duration::from_millis(5);
        let (mut slot, lease, state) = loop {
            // Checked on every pass: a turn waiting for a busy lease must not
            // start on a replica that began draining meanwhile. One local
            // turn per session; a second one waits like a busy lease.
            let outcome = match self.inflight.enter(&ask.key, ask.turn_seq) {
                Ok(slot) => match self.timed("begin", self.store.begin(&begin)).await? {
                    BeginOutcome::Granted { lease, state } => break (slot, lease, state),
                    other => other,
                },
                Err(Refused::Draining) => return Err(TurnError::Draining),
                Err(Refused::SessionBusy) => BeginOutcome::Busy {
                    owner: self.holder.to_string(),
                    retry_after: Duration::from_millis(100),
                },
            };
            match outcome {
                BeginOutcome::Granted { .. } => unreachable!("handled above"),
                BeginOutcome::Duplicate(result) => {
                    return Ok(TurnAnswer {
                        reply: String::from_utf8_lossy(&result.reply).into_owned(),
                        turn_seq: result.turn_seq,
                        version: result.version,
                        duplicate: true,
                    });
                }
                BeginOutcome::Busy { .. } if ask.interrupt && !interrupted => {
                    // Once: the lease is free at once, and the turn that
                    // held it stops within LEASE_CHECK (a local one then
                    // leaves the in-flight registry too).
                    interrupted = true;
                    let stopped = self
                        .timed("interrupt", self.store.interrupt(&ask.key, None))
                        .await?;
                    tracing::info!(session = %ask.key, interrupted = ?stopped.map(|l| (l.owner, l.fence, l.turn_seq)), "interrupt asked by a newer turn");
                }
                BeginOutcome::Busy { owner, retry_after } => {
                    let now = Instant::now();
                    if now + backoff >= deadline {
                        // The holder may have just died: that shows one
                        // heartbeat TTL later, so never hint a longer wait.
                        return Err(TurnError::Busy {
                            session: ask.key.clone(),
                            owner,
                            retry_after: retry_after.min(self.timings.heartbeat_ttl),
                        });
                    }
                    // Waiting for the holder to commit: poll the lease with a
                    // growing pause, never past the caller's deadline.
                    tokio::time::sleep(backoff.min(deadline - now)).await;
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
                BeginOutcome::Gap { next_turn_seq } => {
                    return Err(TurnError::Gap { next_turn_seq });
                }
                BeginOutcome::Stale { last_turn_seq } => {
                    return Err(TurnError::Stale { last_turn_seq });
                }
                BeginOutcome::TurnSeqReused { turn_seq } => {
                    return Err(TurnError::TurnSeqReused { turn_seq });
                }
                BeginOutcome::StateLost { last_version } => {
                    return Err(TurnError::StateLost { last_version });
                }
            }
        };
        slot.granted(lease.fence, lease.turn_seq);
        if let Some(live) = &ask.live {
            live.start(
                lease.fence,
                lease.turn_seq,
                serde_json::json!({
                    "session": ask.key.session.as_str(),
                    "turnSeq": lease.turn_seq,
                    "attempt": lease.fence,
                    "replica": self.replica,
                })
                .to_string(),
            );
        }
        let _held = LeaseGauges::hold(&self.metrics);
        let granted_at_ms = now_ms();
        let result = self
            .with_lease(ask, input_digest.clone(), &lease, state, &mut slot.abort)
            .await;
        if matches!(result, Err(TurnError::Interrupted)) {
            self.record_interrupted(ask, &lease, input_digest, granted_at_ms)
                .await;
        }
        if result.is_err() {
            // Release what we may still hold so the next turn need not wait
            // for the TTL. Compare-and-delete on the fence: a lease we lost,
            // or one a commit already released, is not touched.
            if let Err(e) = self.timed("abort", self.store.abort(&lease)).await {
                tracing::warn!(error = %e, fence = lease.fence, "abort failed; a handover retries it, else the lease expires on its own");
                self.inflight.remember_unreleased(lease.clone());
            }
        }
        result
    }

    /// Keeps the interrupted turn in the session's history, with its input
    /// when the ledger keeps text. A failure costs the history a line, no
    /// more: the turn's outcome is settled.
    async fn record_interrupted(
        &self,
        ask: &TurnAsk,
        lease: &Lease,
        input_digest: String,
        started_at_ms: u64,
    ) {
        let turn = baton_session::TurnRecord {
            tenant: lease.key.tenant.to_string(),
            session: lease.key.session.to_string(),
            turn_seq: lease.turn_seq,
            version: lease.version,
            replica: self.holder.to_string(),
            fence: lease.fence,
            input_digest,
            reply_digest: String::new(),
            workspace: None,
            started_at_ms,
            committed_at_ms: now_ms(),
            input: self.keep_text.then(|| ask.input.clone()),
            reply: None,
            interrupted: true,
        };
        if let Err(e) = self.store.record_interrupted(&turn).await {
            tracing::warn!(error = %e, fence = lease.fence, "the interrupted turn could not be kept in the history");
        }
    }

    async fn with_lease(
        &self,
        ask: &TurnAsk,
        input_digest: String,
        lease: &Lease,
        state: baton_session::SessionState,
        abort: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<TurnAnswer, TurnError> {
        tracing::debug!(
            version = lease.version,
            fence = lease.fence,
            turn_seq = lease.turn_seq,
            "lease granted"
        );
        // The lease is renewed from the grant until the commit is sent:
        // materialising, the agent and the upload all count.
        let prepared = tokio::select! {
            prepared = self.prepare(ask, lease, &state) => prepared,
            () = self.renew_until_lost(lease) => Err(TurnError::LeaseLost),
            stopped = self.until_lease_goes(lease, ask.live.as_deref()) => Err(stopped),
            _ = abort.wait_for(|a| *a) => Err(TurnError::AbortedByDrain),
        };
        let prepared = match prepared {
            Ok(p) => p,
            Err(e) => {
                // The agent may still be running (we stopped waiting), or
                // left half a turn: its generation goes.
                self.local.abandon(&lease.key);
                return Err(e);
            }
        };
        let commit = CommitRequest {
            lease: lease.clone(),
            expected_version: lease.version,
            payload: prepared.payload,
            workspace: prepared.workspace.or(state.workspace),
            reply: Bytes::from(prepared.reply.clone()),
            state_ttl: self.timings.state_ttl,
            started_at_ms: prepared.started_at_ms,
            input_digest,
            input: self.keep_text.then(|| ask.input.clone()),
        };
        let committed = self.timed("commit", self.store.commit(&commit)).await;
        match committed {
            Ok(CommitOutcome::Committed { version }) => {
                self.local.committed(
                    &lease.key,
                    Holds {
                        reference: commit.workspace,
                        manifest: prepared.manifest,
                        files: prepared.files,
                    },
                );
                Ok(TurnAnswer {
                    reply: prepared.reply,
                    turn_seq: lease.turn_seq,
                    version,
                    duplicate: false,
                })
            }
            Ok(CommitOutcome::LeaseLost) => {
                self.local.abandon(&lease.key);
                Err(TurnError::LeaseLost)
            }
            Ok(CommitOutcome::Conflict { current_version }) => {
                self.local.abandon(&lease.key);
                Err(TurnError::Conflict { current_version })
            }
            Err(StoreError::Unavailable(why)) => {
                // The script may have run before the answer was lost.
                self.local.abandon(&lease.key);
                tracing::warn!(error = %why, turn_seq = lease.turn_seq, "commit outcome unknown");
                Err(TurnError::CommitUnknown {
                    turn_seq: lease.turn_seq,
                })
            }
            Err(e) => {
                self.local.abandon(&lease.key);
                Err(e.into())
            }
        }
    }

    /// Everything between the grant and the commit: the workspace, the
    /// agent, the new state and the snapshot of the files.
    async fn prepare(
        &self,
        ask: &TurnAsk,
        lease: &Lease,
        state: &baton_session::SessionState,
    ) -> Result<Prepared, TurnError> {
        let started_at_ms = now_ms();
        let (dir, cached) =
            if let Some(hit) = self.local.check_out_cached(&lease.key, &state.workspace) {
                hit
            } else {
                let (local, root, key, fence, reference) = (
                    self.local.clone(),
                    self.workspace_root.clone(),
                    lease.key.clone(),
                    lease.fence,
                    state.workspace.clone(),
                );
                tokio::task::spawn_blocking(move || local.check_out(&root, &key, fence, &reference))
                    .await
                    .map_err(|e| WorkspaceError::Io(std::io::Error::other(e.to_string())))?
                    .map_err(WorkspaceError::Io)?
            };
        let (base, seen) = match cached {
            Some(holds) => (holds.manifest, holds.files),
            None => {
                let done = self
                    .workspaces
                    .materialize(state.workspace.as_deref(), &dir)
                    .await?;
                (done.manifest, done.files)
            }
        };
        // The state passes through as raw JSON text: checked to be JSON,
        // never parsed into a tree (it can be large, and it is the agent's).
        // It is stored exactly as the agent wrote it, whatever its nesting
        // depth or escapes: an agent must read back what it writes (an
        // agent whose parser refuses its own output fails its next turns,
        // and nothing it committed is lost).
        let payload = state.payload.clone().unwrap_or_default();
        let agent_state: &serde_json::value::RawValue = if payload.is_empty() {
            serde_json::value::RawValue::NULL
        } else {
            serde_json::from_slice(&payload).map_err(|e| {
                StoreError::Corrupt(format!("{}: stored state is not JSON: {e}", lease.key))
            })?
        };
        let request = TurnRequest {
            session: lease.key.session.to_string(),
            tenant: lease.key.tenant.to_string(),
            turn_seq: lease.turn_seq,
            input: ask.input.clone(),
            state: agent_state,
            workspace_dir: dir.clone(),
        };
        let relay = |event: AgentEvent| {
            if let Some(live) = &ask.live {
                match event {
                    AgentEvent::Delta(text) => {
                        live.push(Kind::Delta, serde_json::json!({ "text": text }).to_string())
                    }
                    AgentEvent::Progress(data) => live.push(Kind::Progress, data),
                }
            }
        };
        let response = self
            .agent
            .turn(&request, &relay)
            .await
            .map_err(TurnError::Agent)?;
        let new_payload = Bytes::from(String::from(Box::<str>::from(response.state)));
        if new_payload.len() > baton_session::MAX_PAYLOAD_BYTES {
            return Err(TurnError::BadAgentState(format!(
                "it is {} bytes; the limit is {}",
                new_payload.len(),
                baton_session::MAX_PAYLOAD_BYTES
            )));
        }
        let snapshot = self
            .workspaces
            .snapshot_manifest(
                &dir,
                &base,
                &seen,
                &lease.key,
                lease.version + 1,
                lease.fence,
            )
            .await?;
        Ok(Prepared {
            reply: response.reply,
            payload: new_payload,
            workspace: snapshot.reference,
            manifest: snapshot.manifest,
            files: snapshot.files,
            started_at_ms,
        })
    }

    /// Renews `lease` every renew interval; returns once it is lost. Store
    /// errors are retried until the lease would have expired anyway.
    async fn renew_until_lost(&self, lease: &Lease) {
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
    async fn until_lease_goes(&self, lease: &Lease, live: Option<&LiveTurn>) -> TurnError {
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
