//! A reader for dashboards and tools: sessions, their live views and turn
//! history, and the replicas, from Redis and the ledger, with no
//! background work and no writes. [`crate::store::RedisLedgerStore`]
//! is a replica's store: it ships turn records, and its ledger connection
//! migrates the schema; a dashboard must do neither.

use crate::postgres::PostgresLedger;
use baton_session::ids::SessionKey;
use baton_session::model::{
    CommittedState, ListQuery, ReplicaView, SessionPage, SessionView, TurnRecord,
};
use baton_session::store::{SessionCatalog, StoreResult, TurnStore};
use baton_session::turn_stream::{EventId, StreamEvent, TurnStreamReader};
use baton_store_redis::{KeySpace, RedisStore};

#[derive(Clone)]
pub struct RedisCatalog {
    pub(crate) redis: RedisStore,
    pub(crate) ledger: PostgresLedger,
}

impl RedisCatalog {
    /// Connects to both stores; applies no migration (a ledger that has
    /// none yet answers errors until a replica has started once).
    pub async fn connect(redis_url: &str, database_url: &str) -> StoreResult<Self> {
        Self::connect_in(redis_url, database_url, "").await
    }

    /// [`Self::connect`] for the deployment of store namespace `namespace`.
    pub async fn connect_in(
        redis_url: &str,
        database_url: &str,
        namespace: &str,
    ) -> StoreResult<Self> {
        Ok(Self {
            redis: RedisStore::connect_in(redis_url, KeySpace::new(namespace)).await?,
            ledger: PostgresLedger::connect_reader_in(database_url, namespace).await?,
        })
    }
}

impl SessionCatalog for RedisCatalog {
    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionPage> {
        self.ledger.list_sessions(query).await
    }

    async fn turns(&self, key: &SessionKey, limit: u32) -> StoreResult<Vec<TurnRecord>> {
        self.ledger.turns(key, limit).await
    }

    async fn replicas(&self) -> StoreResult<Vec<ReplicaView>> {
        self.redis.replicas().await
    }

    /// From Redis: the ledger may lag behind it.
    async fn inspect(&self, key: &SessionKey) -> StoreResult<Option<SessionView>> {
        self.redis.session(key).await
    }

    async fn inspect_state(&self, key: &SessionKey) -> StoreResult<Option<CommittedState>> {
        self.redis.read_state(key).await
    }
}

/// A running turn's stream, for a dashboard to show as it is written:
/// Redis's alone (provisional words are never ledgered).
impl TurnStreamReader for RedisCatalog {
    async fn want_events(&self, key: &SessionKey, turn_seq: u64) -> StoreResult<bool> {
        self.redis.want_events(key, turn_seq).await
    }

    async fn read_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<StreamEvent>> {
        self.redis.read_events(key, turn_seq, after, limit).await
    }
}
