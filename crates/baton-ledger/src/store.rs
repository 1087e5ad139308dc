//! The production backend: Redis for the protocol, Postgres for the ledger.
//!
//! Commits go to Redis only; their turn records wait in the session's log
//! until a shipper stores them in Postgres, off the reply path and at least
//! once (the ledger's inserts are idempotent). Each commit wakes its
//! replica's shipper for its session (a bounded queue: when it is full the
//! wake-up is dropped) and indexes the session in Redis; every
//! [`SWEEP_INTERVAL`] one sweeper, whichever shipper holds the sweeper
//! lease, ships what the index still names after [`SWEEP_AFTER`] (a replica
//! killed right after a commit, a dropped wake-up, Postgres down for a
//! while) and drops the entries whose logs are empty. Neither path walks
//! the keyspace.
//!
//! When Redis has no state for a session, the ledger decides (G7): unknown
//! to the ledger, the session is new; known with a durable copy, it is
//! restored (versions and fences continue from there); known without one,
//! the turn gets STATE_LOST. A session idle past its state TTL comes back
//! with its turnSeq and fence but an empty state, as it would have expired
//! anyway, under a new version (the last one + 1), so that a caller caching
//! the last version's payload cannot mistake the reset for it (see
//! `recover`).
//!
//! When Redis has state the ledger may know better: Redis acknowledges a
//! commit before its AOF reaches the disk, so after a crash it can come
//! back older than what it acknowledged. Each state records the Redis run
//! (`run_id`) that vouched for it; the first begin of a session under a new
//! run is checked against the ledger once (`check_against_ledger`), and an
//! older state is replaced by the ledger's copy before anyone builds on it.
//!
//! A brand-new session does not wait for the ledger: a session Redis has
//! never seen committed, in a run whose "known" markers are complete, is
//! new (`redis/known.rs`). So a Postgres outage stops neither existing
//! conversations nor new ones; only a session whose state is gone waits
//! for the ledger to say what it was. The sweeper keeps the markers
//! complete after every Redis start.

use std::collections::BTreeSet;
use std::time::Duration;

use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::mpsc;

use baton_session::durable::{DurableCopy, LedgerSession};
use baton_session::ids::{ReplicaId, SessionKey};

use crate::catalog::RedisCatalog;
use crate::postgres::PostgresLedger;
use baton_session::model::{
    BeginOutcome, BeginRequest, CommitOutcome, CommitRequest, CommittedState, Lease, ListQuery,
    MAX_PAGE, ReplicaView, SessionPage, SessionView, TurnRecord,
};
use baton_session::store::{SessionCatalog, StoreError, StoreResult, TurnStore, WorkspaceRoots};
use baton_session::turn_record::now_ms;
use baton_store_redis::{KeySpace, LeaseRun, OnMissing, RawBegin, RawCommit, RedisStore};

/// How often the sweeper ships the logs no one else shipped.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How old an index entry is before the sweeper takes it: the committing
/// replica's own shipper normally ships it within [`SHIP_LINGER`] and a round.
pub const SWEEP_AFTER: Duration = Duration::from_secs(2);
/// Wake-ups waiting for a replica's shipper; more are dropped (the sweep
/// ships them), so a Postgres outage cannot pile them up.
const WAKE_QUEUE: usize = 16_384;
/// Index entries one sweep looks at, at most (the rest wait a second).
const SWEEP_LIMIT: usize = 16 * SESSIONS_PER_ROUND;
/// After a failed round, the shipper waits this long, doubling up to
/// [`MAX_BACKOFF`], before it tries again.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Records shipped per round trip.
const SHIP_BATCH: usize = 256;
/// How long the shipper waits after a commit for more to ship with it. A
/// session's records ship together when they wait in the same round, and
/// each (session, round) costs a log read, a state read, an ack and a
/// ledger row: at 20 ms a busy session shipped every turn on its own, and
/// the turn cost Redis and Postgres about 10 µs more CPU than at 250 ms
/// (BENCHMARKS.md, issue 13). The ledger lags the commits by this much.
const SHIP_LINGER: Duration = Duration::from_millis(250);
/// Most sessions shipped in one round of the sweep.
const SESSIONS_PER_ROUND: usize = 256;
/// Most sessions shipped in one woken round: what one linger gathers.
const WOKEN_SESSIONS_PER_ROUND: usize = 1024;
/// Sessions the known-index backfill marks per sweep, at most, so that
/// shipping goes on between its pages.
const KNOWN_BACKFILL_PER_SWEEP: usize = 20_000;

/// How far the known-index backfill of one Redis run has got: first the
/// sessions the unshipped index names (records the ledger may not have
/// yet), then every session the ledger knows.
struct KnownBackfill {
    /// The run of each bucket it marks for (one on a single server).
    runs: Vec<String>,
    step: BackfillStep,
}

enum BackfillStep {
    Unshipped { bucket: u16, cursor: u64 },
    Ledger { after: Option<SessionKey> },
}

#[derive(Debug, PartialEq, Eq)]
enum KnownSettled {
    /// Found complete for these runs.
    Complete(Vec<String>),
    /// Dropped under these runs: Redis may evict markers.
    Dropped(Vec<String>),
}

/// What the ledger makes of a session Redis has no state for.
enum Recovery {
    /// Refuse the turn with this (STATE_LOST).
    Answer(BeginOutcome),
    /// Restored from the ledger, or somebody changed the state first.
    BeginAgain,
    /// Unknown to the ledger too: a new session.
    New,
}

#[derive(Default)]
struct ShipRound {
    shipped: usize,
    more: Vec<SessionKey>,
}

#[derive(Clone)]
pub struct RedisLedgerStore {
    /// Both connections; the dashboard's reads are the catalog's.
    catalog: RedisCatalog,
    wake: mpsc::Sender<SessionKey>,
    shipper: std::sync::Arc<Shipper>,
}

/// The background shipper of a store opened with
/// [`RedisLedgerStore::connect`]: its identity for the sweeper lease, and
/// how to stop it.
#[derive(Default)]
struct Shipper {
    id: String,
    stop: tokio::sync::watch::Sender<bool>,
    done: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The known-index backfill in progress (the sweeper's, in memory: a
    /// new sweeper starts it over).
    known: tokio::sync::Mutex<Option<KnownBackfill>>,
    /// What the last sweep settled about the known index, for the runs
    /// (per bucket) answering then: while they answer, a sweep reads no
    /// watermark.
    known_settled: std::sync::Mutex<Option<KnownSettled>>,
    /// When (Unix ms) the oldest commit this process made that has not
    /// shipped yet was made; 0 when none waits. Set by a commit when 0,
    /// cleared when a round leaves the wake-up queue empty.
    oldest_unshipped_ms: std::sync::atomic::AtomicU64,
}

impl RedisLedgerStore {
    /// Connects both stores and starts the shipper on the current runtime.
    pub async fn connect(redis_url: &str, database_url: &str) -> StoreResult<Self> {
        Self::connect_in(redis_url, database_url, "").await
    }

    /// [`Self::connect`] in the store namespace `namespace`: every Redis
    /// key under its own prefix ([`baton_store_redis::KeySpace`]) and the ledger
    /// in its own Postgres schema, so deployments sharing the servers never
    /// meet. The empty namespace is the layout from before namespaces.
    pub async fn connect_in(
        redis_url: &str,
        database_url: &str,
        namespace: &str,
    ) -> StoreResult<Self> {
        let (store, woken) = Self::open(redis_url, database_url, namespace).await?;
        let task = tokio::spawn(store.clone().ship_forever(woken));
        *store.shipper.done.lock().await = Some(task);
        Ok(store)
    }

    /// Stops the shipper after one last round of what it was woken for
    /// (a replica calls it once its turns are drained). Records it did not
    /// ship stay in Redis, indexed for the next sweeper.
    pub async fn stop_shipping(&self) {
        self.shipper.stop.send_replace(true);
        if let Some(task) = self.shipper.done.lock().await.take()
            && let Err(e) = task.await
        {
            tracing::warn!(error = %e, "the shipper ended abnormally");
        }
    }

    /// Both stores with nobody shipping in the background: records stay in
    /// Redis until [`ship`](Self::ship), [`ship_many`](Self::ship_many) or
    /// [`sweep`](Self::sweep) is called. For tools and tests that ship by
    /// hand and must know who shipped what; a replica uses [`connect`](Self::connect).
    pub async fn connect_without_shipper(redis_url: &str, database_url: &str) -> StoreResult<Self> {
        Self::connect_without_shipper_in(redis_url, database_url, "").await
    }

    /// [`Self::connect_without_shipper`] in the store namespace `namespace`.
    pub async fn connect_without_shipper_in(
        redis_url: &str,
        database_url: &str,
        namespace: &str,
    ) -> StoreResult<Self> {
        // Commits' wake-ups go to a closed channel and are dropped.
        let (store, _woken) = Self::open(redis_url, database_url, namespace).await?;
        Ok(store)
    }

    async fn open(
        redis_url: &str,
        database_url: &str,
        namespace: &str,
    ) -> StoreResult<(Self, mpsc::Receiver<SessionKey>)> {
        let redis = RedisStore::connect_in(redis_url, KeySpace::new(namespace)).await?;
        let ledger = PostgresLedger::connect_in(database_url, namespace).await?;
        let (wake, woken) = mpsc::channel(WAKE_QUEUE);
        let shipper = Shipper {
            id: format!("shipper-{:016x}", rand::random::<u64>()),
            ..Shipper::default()
        };
        Ok((
            Self {
                catalog: RedisCatalog { redis, ledger },
                wake,
                shipper: std::sync::Arc::new(shipper),
            },
            woken,
        ))
    }

    /// Another handle on the same stores with a Redis connection of its own,
    /// opened on the current runtime: a sidecar keeps one per runtime
    /// thread, so each thread's turns go out on its own socket and never
    /// wait for another thread. The ledger's pool and the shipper (woken by
    /// every handle's commits) stay shared.
    pub async fn with_own_redis_connection(&self, redis_url: &str) -> StoreResult<Self> {
        Ok(Self {
            catalog: RedisCatalog {
                redis: self.catalog.redis.another_connection(redis_url).await?,
                ledger: self.catalog.ledger.clone(),
            },
            wake: self.wake.clone(),
            shipper: self.shipper.clone(),
        })
    }

    pub fn ledger(&self) -> &PostgresLedger {
        &self.catalog.ledger
    }

    /// This store's shipper identity, as the sweeper lease names it.
    pub fn shipper_id(&self) -> &str {
        &self.shipper.id
    }

    /// Ships every unshipped record of `key`; returns how many.
    pub async fn ship(&self, key: &SessionKey) -> StoreResult<usize> {
        let mut shipped = 0;
        loop {
            let round = self.ship_round(std::slice::from_ref(key)).await?;
            shipped += round.shipped;
            if round.more.is_empty() {
                return Ok(shipped);
            }
        }
    }

    /// Ships the unshipped records of several sessions together: one Redis
    /// read, one ledger transaction and one Redis ack for all of them.
    pub async fn ship_many(&self, keys: &[SessionKey]) -> StoreResult<usize> {
        let round = self.ship_round(keys).await?;
        let mut shipped = round.shipped;
        for key in &round.more {
            shipped += self.ship(key).await?;
        }
        Ok(shipped)
    }

    /// One batch per session; `more` lists the sessions that had a full one.
    async fn ship_round(&self, keys: &[SessionKey]) -> StoreResult<ShipRound> {
        let batches: Vec<_> = self
            .catalog
            .redis
            .ship_batches(keys, SHIP_BATCH)
            .await?
            .into_iter()
            .filter(|b| !b.records.is_empty())
            .collect();
        if batches.is_empty() {
            return Ok(ShipRound::default());
        }
        let refused = self.catalog.ledger.record_many(&batches).await?;
        // Refused batches (read from a state an earlier Redis run vouched
        // for) stay in the logs to be read again.
        let batches: Vec<_> = batches
            .into_iter()
            .filter(|b| !refused.contains(&b.key))
            .collect();
        // Only the records just stored leave the logs, named one by one: a
        // record that arrived meanwhile stays, even with a turnSeq no higher.
        let dropped = self.catalog.redis.ack_shipped(&batches).await?;
        let mut round = ShipRound::default();
        for (batch, dropped) in batches.iter().zip(dropped) {
            round.shipped += batch.records.len();
            // Nothing dropped means the head of the log is not what we
            // read: stop rather than loop; the next sweep looks again.
            if batch.records.len() == SHIP_BATCH && dropped > 0 {
                round.more.push(batch.key.clone());
            }
        }
        Ok(round)
    }

    /// One sweep, if this shipper holds the sweeper lease (or takes it):
    /// ships the sessions the index has named for longer than
    /// [`SWEEP_AFTER`] and drops the entries whose logs are empty. A session
    /// that fails (a corrupt record, a ledger error) is logged and skipped,
    /// so it cannot hold back the others. Returns how many records it
    /// shipped (0 when another shipper sweeps).
    pub async fn sweep(&self) -> StoreResult<usize> {
        if !self
            .catalog
            .redis
            .sweeper_lease(&self.shipper.id, SWEEP_INTERVAL * 3)
            .await?
        {
            return Ok(0);
        }
        let shipped = self.sweep_now().await?;
        // Its errors are the ledger's or Redis's, which the shipping above
        // reports already; the index waits for the next sweep.
        if let Err(e) = self.maintain_known_index().await {
            tracing::debug!(error = %e, "maintaining the known-session index failed");
        }
        Ok(shipped)
    }

    /// Keeps the known index (`redis/known.rs`) usable for the Redis run
    /// answering now: drops its watermark if Redis may evict markers,
    /// otherwise backfills up to [`KNOWN_BACKFILL_PER_SWEEP`] sessions and
    /// writes the watermark once every one is marked. True when the index
    /// is complete. The sweeper calls it; tools and tests may too.
    pub async fn maintain_known_index(&self) -> StoreResult<bool> {
        let check = self.catalog.redis.known_index_check().await?;
        let settled = |what: &KnownSettled| {
            self.shipper
                .known_settled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                == Some(what)
        };
        let settle = |what: Option<KnownSettled>| {
            *self
                .shipper
                .known_settled
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = what;
        };
        if check.may_evict_markers() {
            let dropped = KnownSettled::Dropped(check.runs);
            if !settled(&dropped) {
                tracing::warn!(policy = %check.eviction_policy,
                    "Redis may evict keys that have no TTL, session markers among them: new sessions ask the ledger");
                self.catalog.redis.drop_known_index().await?;
                settle(Some(dropped));
            }
            return Ok(false);
        }
        let complete = KnownSettled::Complete(check.runs.clone());
        if settled(&complete)
            || self
                .catalog
                .redis
                .known_index_complete_for(&check.runs)
                .await?
        {
            settle(Some(complete));
            return Ok(true);
        }
        settle(None);
        let mut backfill = self.shipper.known.lock().await;
        if backfill.as_ref().is_none_or(|b| b.runs != check.runs) {
            tracing::info!(runs = ?check.runs.iter().collect::<BTreeSet<_>>(),
                "marking the sessions the ledger knows, for the Redis runs answering now");
            *backfill = Some(KnownBackfill {
                runs: check.runs.clone(),
                step: BackfillStep::Unshipped {
                    bucket: 0,
                    cursor: 0,
                },
            });
        }
        let Some(state) = backfill.as_mut() else {
            return Ok(false);
        };
        let buckets = u16::try_from(state.runs.len()).unwrap_or(1);
        let mut marked = 0;
        while marked < KNOWN_BACKFILL_PER_SWEEP {
            match &mut state.step {
                BackfillStep::Unshipped { bucket, cursor } => {
                    let (next, members) = self
                        .catalog
                        .redis
                        .unshipped_members_page(*bucket, *cursor)
                        .await?;
                    self.catalog.redis.mark_known_members(&members).await?;
                    marked += members.len().max(1);
                    state.step = match (next, *bucket + 1) {
                        (0, next_bucket) if next_bucket < buckets => BackfillStep::Unshipped {
                            bucket: next_bucket,
                            cursor: 0,
                        },
                        (0, _) => BackfillStep::Ledger { after: None },
                        (next, _) => BackfillStep::Unshipped {
                            bucket: *bucket,
                            cursor: next,
                        },
                    };
                }
                BackfillStep::Ledger { after } => {
                    let page = self
                        .catalog
                        .ledger
                        .list_sessions(&ListQuery {
                            after: after.take(),
                            limit: MAX_PAGE,
                            ..ListQuery::default()
                        })
                        .await?;
                    let keys: Vec<SessionKey> = page.sessions.into_iter().map(|s| s.key).collect();
                    self.catalog.redis.mark_known(&keys).await?;
                    marked += keys.len().max(1);
                    match page.next {
                        Some(next) => *after = Some(next),
                        None => {
                            let done = self.catalog.redis.complete_known_index(&state.runs).await?;
                            if done {
                                tracing::info!(
                                    "every session the ledger knows is marked: new sessions start without it"
                                );
                                settle(Some(KnownSettled::Complete(state.runs.clone())));
                            }
                            *backfill = None;
                            return Ok(done);
                        }
                    }
                }
            }
        }
        Ok(false)
    }

    /// [`Self::sweep`] without the lease: for tools and tests that ship by hand.
    pub async fn sweep_now(&self) -> StoreResult<usize> {
        let backfilled = self.catalog.redis.backfill_unshipped().await?;
        if backfilled > 0 {
            tracing::info!(
                sessions = backfilled,
                "indexed the logs written before the unshipped index existed"
            );
        }
        let entries = self
            .catalog
            .redis
            .unshipped(SWEEP_AFTER.as_millis() as u64, SWEEP_LIMIT)
            .await?;
        let mut shipped = 0;
        for chunk in entries.chunks(SESSIONS_PER_ROUND) {
            let keys: Vec<&SessionKey> = chunk.iter().map(|e| &e.key).collect();
            let lengths = self.catalog.redis.log_lengths(&keys).await?;
            let (empty, waiting): (Vec<_>, Vec<_>) =
                chunk.iter().zip(lengths).partition(|(_, n)| *n == 0);
            let mut waiting: Vec<SessionKey> =
                waiting.into_iter().map(|(e, _)| e.key.clone()).collect();
            // In key order, as the woken path gathers them, so a chunk
            // holds neighbouring sessions; the ledger's upsert refuses one
            // session twice in a round.
            waiting.sort();
            waiting.dedup();
            if !waiting.is_empty() {
                shipped += self.ship_each(&waiting).await;
            }
            // Logs found empty leave the index, unless a commit came since.
            let empty: Vec<_> = empty.into_iter().map(|(e, _)| e).collect();
            self.catalog.redis.unindex(&empty).await?;
        }
        Ok(shipped)
    }

    /// Ships `keys` together, or one by one when that fails, to find and
    /// skip the session that fails. Returns how many records it shipped.
    async fn ship_each(&self, keys: &[SessionKey]) -> usize {
        if let Ok(n) = self.ship_many(keys).await {
            return n;
        }
        let mut shipped = 0;
        for key in keys {
            match self.ship(key).await {
                Ok(n) => shipped += n,
                Err(e) => {
                    tracing::warn!(session = %key, error = %e, "shipping this session's turn records failed")
                }
            }
        }
        shipped
    }

    async fn ship_forever(self, mut woken: mpsc::Receiver<SessionKey>) {
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = self.shipper.stop.subscribe();
        let mut backoff = FIRST_BACKOFF;
        loop {
            let result = tokio::select! {
                key = woken.recv() => match key {
                    Some(key) => {
                        // Linger briefly so the commits of the next few
                        // milliseconds ship in the same round: one Redis
                        // read and one ledger transaction for all of them,
                        // instead of round trips competing with every turn.
                        tokio::time::sleep(SHIP_LINGER).await;
                        self.ship_woken(key, &mut woken).await
                    }
                    None => return,
                },
                _ = sweep.tick() => self.sweep().await.map(|_| ()),
                // Mapped to (): the guard `wait_for` answers is not Send.
                () = async { let _ = stop.wait_for(|s| *s).await; } => break,
            };
            match result {
                Ok(()) => {
                    backoff = FIRST_BACKOFF;
                    self.note_shipped(&woken);
                }
                Err(e) => {
                    // The records stay in Redis, indexed; wake-ups that
                    // arrive meanwhile queue up to WAKE_QUEUE, then drop.
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "shipping turn records to the ledger failed; will retry");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        // Stopped: one last round of what this replica committed.
        if let Ok(key) = woken.try_recv()
            && let Err(e) = self.ship_woken(key, &mut woken).await
        {
            tracing::warn!(error = %e, "the last shipping round failed; a sweeper ships it later");
        }
    }

    /// After a successful round: with no wake-up waiting, everything this
    /// process committed has shipped, as far as it knows (a dropped
    /// wake-up is the sweeper's to ship, and a commit racing this check
    /// marks itself again below).
    fn note_shipped(&self, woken: &mpsc::Receiver<SessionKey>) {
        let oldest = &self.shipper.oldest_unshipped_ms;
        if woken.is_empty() && oldest.load(Ordering::Relaxed) != 0 {
            oldest.store(0, Ordering::Relaxed);
            if !woken.is_empty() {
                let _ = oldest.compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed);
            }
        }
    }

    /// Ships `first` and whatever else the queue holds now, up to a round.
    async fn ship_woken(
        &self,
        first: SessionKey,
        woken: &mut mpsc::Receiver<SessionKey>,
    ) -> StoreResult<()> {
        let mut keys = BTreeSet::from([first]);
        while keys.len() < WOKEN_SESSIONS_PER_ROUND {
            match woken.try_recv() {
                Ok(key) => keys.insert(key),
                Err(_) => break,
            };
        }
        let keys: Vec<_> = keys.into_iter().collect();
        self.ship_many(&keys).await.map(|_| ())
    }

    /// The ledger's answer for a session Redis (as run `judged_in`) has no
    /// state for.
    async fn recover(&self, req: &BeginRequest, judged_in: &str) -> StoreResult<Recovery> {
        // Records of this session still in Redis go to the ledger first, so
        // it is as current as it can be before it decides.
        self.ship(&req.key).await?;
        // Claimed for this run: a shipper of an earlier run held up until
        // now cannot change what the ledger knows after this decision.
        let Some(known) = self.catalog.ledger.claim(&req.key, judged_in).await? else {
            return Ok(Recovery::New);
        };
        Ok(
            match self.restore_from(req, &known, None, judged_in).await? {
                Some(answer) => Recovery::Answer(answer),
                None => Recovery::BeginAgain,
            },
        )
    }

    /// Checks a state Redis holds at `version` but has not vouched for since
    /// it (re)started against the ledger. Redis acknowledges a commit before
    /// its AOF reaches the disk (once a second), so after a crash it can come
    /// back with an older state than clients were told about, and the
    /// ledger may hold newer turns: building on the older state would hand
    /// out versions a second time (G7). A state no older than the ledger's
    /// is vouched for and used; an older one is replaced by the ledger's
    /// durable copy, or refused with STATE_LOST when the ledger has none.
    /// `None`: begin again.
    async fn check_against_ledger(
        &self,
        req: &BeginRequest,
        version: u64,
        judged_in: &str,
    ) -> StoreResult<Option<BeginOutcome>> {
        self.ship(&req.key).await?;
        // Claimed for this run (see `recover`).
        let known = self.catalog.ledger.claim(&req.key, judged_in).await?;
        match known {
            Some(known)
                if known.last_version > version
                    || known.durable.as_ref().is_some_and(|d| d.version > version) =>
            {
                tracing::warn!(session = %req.key, redis_version = version, ledger_version = known.last_version,
                    "Redis came back with an older state than the ledger's");
                self.restore_from(req, &known, Some(version), judged_in)
                    .await
            }
            _ => {
                self.catalog
                    .redis
                    .vouch(&req.key, version, judged_in)
                    .await?;
                Ok(None)
            }
        }
    }

    /// A commit whose lease was granted on a state another Redis run
    /// vouched for (the granting begin went by a stale idea of the run:
    /// Redis restarted, a master failed over, or the session's slot moved
    /// to another master): checks the state, still at `version`, against
    /// the ledger as `begin` would have, and vouches for it in `run` when
    /// the ledger knows nothing newer. False when it does: the commit is
    /// LEASE_LOST, and the next begin restores the ledger's copy.
    async fn vouch_for_commit(
        &self,
        key: &SessionKey,
        version: u64,
        run: &str,
    ) -> StoreResult<bool> {
        self.ship(key).await?;
        let known = self.catalog.ledger.claim(key, run).await?;
        let newer = known.is_some_and(|known| {
            known.last_version > version || known.durable.is_some_and(|d| d.version > version)
        });
        if newer {
            return Ok(false);
        }
        self.catalog.redis.vouch(key, version, run).await
    }

    /// Writes the ledger's idea of the session back into Redis (over the
    /// older state at version `replacing`, if any), or says why it cannot.
    /// `None`: begin again (restored, or somebody changed the state first).
    async fn restore_from(
        &self,
        req: &BeginRequest,
        known: &LedgerSession,
        replacing: Option<u64>,
        judged_in: &str,
    ) -> StoreResult<Option<BeginOutcome>> {
        let idle = now_ms().saturating_sub(known.last_turn_at_ms);
        let expired = u128::from(idle) >= req.state_ttl.as_millis();
        // Version and turnSeq advance together, one per commit: a copy ahead
        // of the ledger's last turn is as many turns further on. (A reset,
        // below, adds a version without a turn. The log is shipped before
        // one, so the ledger's last turn and a copy ahead of it are on the
        // same side of it; were they not, the turnSeq would come out one too
        // high: one skipped, never one used twice.)
        let turn_seq_at =
            |version: u64| known.last_turn_seq + version.saturating_sub(known.last_version);
        let (copy, turn_seq) = match (&known.durable, expired) {
            (_, true) => {
                let last = known
                    .last_version
                    .max(known.durable.as_ref().map_or(0, |d| d.version));
                // The rule for a session back after its state TTL: its state
                // is reset to empty under a NEW version, last + 1, never
                // under `last`. A caller that cached `last`'s payload
                // (BeginRequest::cached_version) must not be told to use it:
                // with the version unchanged, "you hold this version" and
                // "this version, emptied" would look the same. The reset is
                // not a turn: turnSeq stays (the next turn takes the next one,
                // so the ledger's key (tenant, session, turnSeq) stays unique)
                // and no ledger row is written. Versions and fences still
                // only grow; a reset repeated before the next commit is the
                // same empty state at the same version. SQLite does the same
                // (sqlite.rs, expire_if_due).
                let reset = DurableCopy {
                    version: last + 1,
                    payload: Bytes::new(),
                    workspace: None,
                };
                (reset, turn_seq_at(last))
            }
            // A copy older than the last turn the ledger knows would send the
            // version backwards: refuse instead.
            (Some(copy), false) if copy.version < known.last_version => {
                return Ok(Some(BeginOutcome::StateLost {
                    last_version: known.last_version,
                }));
            }
            (Some(copy), false) => (copy.clone(), turn_seq_at(copy.version)),
            (None, false) => {
                return Ok(Some(BeginOutcome::StateLost {
                    last_version: known.last_version,
                }));
            }
        };
        let restored = self
            .catalog
            .redis
            .restore(known, &copy, turn_seq, req.state_ttl, replacing, judged_in)
            .await?;
        tracing::warn!(session = %req.key, version = copy.version, restored, expired, "session state restored from the ledger");
        Ok(None)
    }
}

impl TurnStore for RedisLedgerStore {
    async fn begin(&self, req: &BeginRequest) -> StoreResult<BeginOutcome> {
        // Each pass settles one thing (a missing or an unvouched state); a
        // session that keeps changing underneath gets a few more.
        for _ in 0..4 {
            let mut raw = self
                .catalog
                .redis
                .begin_with(req, OnMissing::Report)
                .await?;
            if let RawBegin::Missing { run, known: false } = &raw
                && self
                    .catalog
                    .redis
                    .known_index_complete_in(&req.key, run)
                    .await?
            {
                // Never committed through this Redis, whose markers are
                // complete in this run: new, without asking the ledger
                // (`redis/known.rs`). MISSING again: the ledger decides.
                let run = run.clone();
                raw = self
                    .catalog
                    .redis
                    .begin_with(req, OnMissing::CreateUnknown { run: &run })
                    .await?;
            }
            match raw {
                RawBegin::Outcome(outcome) => return Ok(outcome),
                RawBegin::Unverified { version, run } => {
                    if let Some(refusal) = self.check_against_ledger(req, version, &run).await? {
                        return Ok(refusal);
                    }
                }
                RawBegin::Missing { run, .. } => match self.recover(req, &run).await? {
                    Recovery::Answer(refusal) => return Ok(refusal),
                    Recovery::BeginAgain => {}
                    // New to the ledger too: begin for real.
                    Recovery::New => {
                        return match self
                            .catalog
                            .redis
                            .begin_with(req, OnMissing::Create)
                            .await?
                        {
                            RawBegin::Outcome(outcome) => Ok(outcome),
                            RawBegin::Missing { .. } | RawBegin::Unverified { .. } => {
                                Err(StoreError::Corrupt(
                                    "begin reported a state it was told to create".into(),
                                ))
                            }
                        };
                    }
                },
            }
        }
        Err(StoreError::Unavailable(format!(
            "{}: the state kept changing while it was checked against the ledger",
            req.key
        )))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> StoreResult<bool> {
        self.catalog.redis.renew(lease, ttl).await
    }

    async fn commit(&self, req: &CommitRequest) -> StoreResult<CommitOutcome> {
        let mut outcome = CommitOutcome::LeaseLost;
        // Each pass settles one run change under the lease; a state that
        // keeps moving between runs gets a few more, then LEASE_LOST.
        for _ in 0..3 {
            match self
                .catalog
                .redis
                .commit_with(req, LeaseRun::ThisRun)
                .await?
            {
                RawCommit::Outcome(answer) => {
                    outcome = answer;
                    break;
                }
                RawCommit::Unverified { version, run } => {
                    if !self.vouch_for_commit(&req.lease.key, version, &run).await? {
                        break;
                    }
                }
            }
        }
        if matches!(outcome, CommitOutcome::Committed { .. }) {
            let _ = self.shipper.oldest_unshipped_ms.compare_exchange(
                0,
                now_ms(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            // Off the reply path. A full queue (Postgres down, a burst)
            // drops the wake-up: the session is indexed, the sweep ships it.
            let _ = self.wake.try_send(req.lease.key.clone());
        }
        Ok(outcome)
    }

    async fn abort(&self, lease: &Lease) -> StoreResult<bool> {
        self.catalog.redis.abort(lease).await
    }

    async fn revoke(&self, key: &SessionKey) -> StoreResult<Option<String>> {
        self.catalog.redis.revoke(key).await
    }

    async fn claim_layout(&self, mine: u32, adopt: bool) -> StoreResult<u32> {
        self.catalog.redis.claim_layout(mine, adopt).await
    }

    async fn heartbeat_with(
        &self,
        replica: &ReplicaId,
        info: baton_session::model::ReplicaInfo,
        ttl: Duration,
    ) -> StoreResult<()> {
        self.catalog.redis.heartbeat_with(replica, info, ttl).await
    }

    async fn session(&self, key: &SessionKey) -> StoreResult<Option<SessionView>> {
        self.catalog.redis.session(key).await
    }

    fn oldest_unshipped_ms(&self) -> Option<u64> {
        match self.shipper.oldest_unshipped_ms.load(Ordering::Relaxed) {
            0 => None,
            at => Some(at),
        }
    }

    async fn read_state(&self, key: &SessionKey) -> StoreResult<Option<CommittedState>> {
        self.catalog.redis.read_state(key).await
    }
}

impl WorkspaceRoots for RedisLedgerStore {
    async fn collector_lease(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        self.catalog.redis.collector_lease(holder, ttl).await
    }

    /// Redis first: a state committed after that read either ships before
    /// the ledger is read (its durable copy names it) or its manifest is
    /// younger than any retention the collector uses.
    async fn live_workspaces(&self) -> StoreResult<std::collections::HashSet<String>> {
        let mut live: std::collections::HashSet<String> = self
            .catalog
            .redis
            .unshipped_workspaces()
            .await?
            .into_iter()
            .collect();
        live.extend(self.catalog.ledger.durable_workspaces().await?);
        Ok(live)
    }
}

/// The catalog's reads, on this store's connections: where each comes from
/// is decided once, in [`RedisCatalog`].
impl SessionCatalog for RedisLedgerStore {
    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionPage> {
        self.catalog.list_sessions(query).await
    }

    async fn turns(&self, key: &SessionKey, limit: u32) -> StoreResult<Vec<TurnRecord>> {
        self.catalog.turns(key, limit).await
    }

    async fn replicas(&self) -> StoreResult<Vec<ReplicaView>> {
        self.catalog.replicas().await
    }

    async fn inspect(&self, key: &SessionKey) -> StoreResult<Option<SessionView>> {
        self.catalog.inspect(key).await
    }

    async fn inspect_state(&self, key: &SessionKey) -> StoreResult<Option<CommittedState>> {
        self.catalog.inspect_state(key).await
    }
}
