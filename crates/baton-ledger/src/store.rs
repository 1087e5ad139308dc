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

use std::time::Duration;

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use baton_session::ids::{ReplicaId, SessionKey};

use crate::catalog::RedisCatalog;
use crate::postgres::PostgresLedger;
use crate::shipper::{Shipper, WAKE_QUEUE};
use baton_session::model::{
    BeginOutcome, BeginRequest, CommitOutcome, CommitRequest, CommittedState, Lease, LeaseCheck,
    LeaseView, ListQuery, ReplicaView, SessionPage, SessionView, TurnRecord,
};
use baton_session::store::{SessionCatalog, StoreResult, TurnStore, WorkspaceRoots};
use baton_session::turn_record::now_ms;
use baton_session::turn_stream::{EventId, StreamEvent, TurnStreamReader, TurnStreams};
use baton_store_redis::{KeySpace, LeaseRun, RawCommit, RedisStore};

#[derive(Clone)]
pub struct RedisLedgerStore {
    /// Both connections; the dashboard's reads are the catalog's.
    pub(crate) catalog: RedisCatalog,
    pub(crate) wake: mpsc::Sender<SessionKey>,
    pub(crate) shipper: std::sync::Arc<Shipper>,
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
}

impl TurnStore for RedisLedgerStore {
    async fn begin(&self, req: &BeginRequest) -> StoreResult<BeginOutcome> {
        self.begin_judged(req).await
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

    async fn interrupt(
        &self,
        key: &SessionKey,
        turn_seq: Option<u64>,
    ) -> StoreResult<Option<LeaseView>> {
        self.catalog.redis.interrupt(key, turn_seq).await
    }

    async fn check_lease(&self, lease: &Lease) -> StoreResult<LeaseCheck> {
        self.catalog.redis.check_lease(lease).await
    }

    /// Straight to the ledger: an interrupted turn is rare, and Redis's log
    /// ships committed turns only.
    async fn record_interrupted(&self, turn: &TurnRecord) -> StoreResult<()> {
        self.catalog.ledger.record_interrupted(turn).await
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

impl baton_session::LedgerRetention for RedisLedgerStore {
    async fn forget_turns_before(&self, before_ms: u64, limit: u32) -> StoreResult<u64> {
        self.catalog
            .ledger
            .forget_turns_before(before_ms, limit)
            .await
    }
}

/// Turn streams are Redis's alone: provisional words, never ledgered.
impl TurnStreams for RedisLedgerStore {
    async fn append_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        events: &[StreamEvent],
    ) -> StoreResult<bool> {
        self.catalog
            .redis
            .append_events(key, turn_seq, events)
            .await
    }
}

impl TurnStreamReader for RedisLedgerStore {
    async fn want_events(&self, key: &SessionKey, turn_seq: u64) -> StoreResult<bool> {
        self.catalog.redis.want_events(key, turn_seq).await
    }

    async fn read_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<StreamEvent>> {
        self.catalog
            .redis
            .read_events(key, turn_seq, after, limit)
            .await
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
