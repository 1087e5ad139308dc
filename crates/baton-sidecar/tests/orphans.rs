//! A lease a replica holds for a turn it no longer runs (the grant's answer
//! was lost, the turn panicked before releasing it) is reclaimed by that
//! replica's next turn of the session at once, not after the lease TTL.
//!
//! The engine runs in-process against real stores (SQLite, and a real
//! `redis-server`) and the real reference agent; the faults are injected by
//! a store wrapper at the engine's store boundary: the first `begin` runs
//! for real and its answer is replaced by the error a lost answer gives,
//! and a `commit` panics before it reaches the store.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_session::*;
use baton_sidecar::agent_client::AgentClient;
use baton_sidecar::engine::{Engine, TurnAsk, TurnError};
use baton_store_redis::RedisStore;
use baton_store_sqlite::SqliteStore;
use baton_workspace::WorkspaceStore;

/// A real store whose next begin answer is lost, or whose next commit
/// panics, when asked to.
struct Faulty<S> {
    inner: S,
    lose_begin_answer: AtomicBool,
    panic_in_commit: AtomicBool,
}

impl<S: TurnStore> TurnStore for Faulty<S> {
    async fn begin(&self, req: &BeginRequest) -> StoreResult<BeginOutcome> {
        let outcome = self.inner.begin(req).await?;
        if self.lose_begin_answer.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Unavailable(
                "injected: the answer to begin was lost".into(),
            ));
        }
        Ok(outcome)
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> StoreResult<bool> {
        self.inner.renew(lease, ttl).await
    }
    async fn commit(&self, req: &CommitRequest) -> StoreResult<CommitOutcome> {
        if self.panic_in_commit.swap(false, Ordering::SeqCst) {
            panic!("injected: the turn panics before its commit");
        }
        self.inner.commit(req).await
    }
    async fn abort(&self, lease: &Lease) -> StoreResult<bool> {
        self.inner.abort(lease).await
    }
    async fn revoke(&self, key: &SessionKey) -> StoreResult<Option<String>> {
        self.inner.revoke(key).await
    }
    async fn interrupt(
        &self,
        key: &SessionKey,
        turn_seq: Option<u64>,
    ) -> StoreResult<Option<LeaseView>> {
        self.inner.interrupt(key, turn_seq).await
    }
    async fn check_lease(&self, lease: &Lease) -> StoreResult<LeaseCheck> {
        self.inner.check_lease(lease).await
    }
    async fn heartbeat_with(
        &self,
        replica: &ReplicaId,
        info: ReplicaInfo,
        ttl: Duration,
    ) -> StoreResult<()> {
        self.inner.heartbeat_with(replica, info, ttl).await
    }
    async fn read_state(&self, key: &SessionKey) -> StoreResult<Option<CommittedState>> {
        self.inner.read_state(key).await
    }
    async fn session(&self, key: &SessionKey) -> StoreResult<Option<SessionView>> {
        self.inner.session(key).await
    }
}

fn ask(input: &str, turn_seq: u64) -> TurnAsk {
    TurnAsk {
        key: SessionKey::new("acme", "orphan").unwrap(),
        input: input.into(),
        turn_seq: Some(turn_seq),
        wait: Duration::ZERO,
        interrupt: false,
        live: None,
    }
}

async fn orphans_are_reclaimed<S: TurnStore + 'static>(store: S) {
    let dir = tempfile::tempdir().unwrap();
    let lease_ttl = support::timings().lease_ttl;
    let engine = Arc::new(
        Engine::new(
            Faulty {
                inner: store,
                lose_begin_answer: AtomicBool::new(false),
                panic_in_commit: AtomicBool::new(false),
            },
            WorkspaceStore::local(&dir.path().join("objects")).unwrap(),
            AgentClient::new(&support::agent().await, Duration::from_secs(10)),
            "solo",
            support::timings(),
            dir.path().join("workspace"),
        )
        .unwrap(),
    );
    engine.heartbeat().await.unwrap();
    let answer = engine.turn(ask("my name is Lin", 1)).await.unwrap();
    assert_eq!(answer.version, 1);

    // The grant happens, its answer is lost: the turn fails and the lease
    // stays with this replica, which does not know it has it.
    engine.store.lose_begin_answer.store(true, Ordering::SeqCst);
    let lost = engine.turn(ask("hello", 2)).await.unwrap_err();
    assert_eq!(lost.outcome().as_str(), "STORE_UNAVAILABLE", "{lost}");
    let view = engine
        .store
        .session(&ask("", 2).key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        view.lease.map(|l| l.owner).as_deref(),
        Some(engine.holder.as_str())
    );
    // The client's retry: answered now, not BUSY naming this replica for
    // the rest of a 30 s lease.
    let started = Instant::now();
    let retried = engine.turn(ask("hello", 2)).await;
    assert!(
        retried.is_ok(),
        "a retry after a lost grant: {:?}",
        retried.map_err(|e| e.to_string())
    );
    assert!(started.elapsed() < lease_ttl / 2);
    assert_eq!(retried.unwrap().version, 2);

    // A turn panics after its grant: nothing releases its lease.
    engine.store.panic_in_commit.store(true, Ordering::SeqCst);
    let panicked = tokio::spawn({
        let engine = engine.clone();
        async move { engine.turn(ask("boom", 3)).await }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    match engine.turn(ask("after the panic", 3)).await {
        Ok(answer) => assert_eq!(answer.version, 3),
        Err(TurnError::Busy { owner, .. }) => {
            panic!("the panicked turn's lease still holds the session for {owner}")
        }
        Err(e) => panic!("after the panic: {e}"),
    }
    // Still "Lin": every committed turn is there, none twice.
    let answer = engine.turn(ask("what is my name", 4)).await.unwrap();
    assert_eq!(
        (answer.reply.as_str(), answer.version),
        ("Your name is Lin.", 4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_leases_are_reclaimed_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("baton.db"))
        .await
        .unwrap();
    orphans_are_reclaimed(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_leases_are_reclaimed_on_redis() {
    let server = baton_testkit::RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    orphans_are_reclaimed(store).await;
}
