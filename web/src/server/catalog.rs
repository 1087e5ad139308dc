//! What the dashboard reads of the stores: an object-safe face of
//! `baton-session`'s read-only [`SessionCatalog`], so one router serves the
//! embedded store and Redis + Postgres alike. Errors are messages for a
//! page: the kind of failure, never a store URL or password (the log gets
//! the detail).

use std::future::Future;
use std::pin::Pin;

use crate::server::error::PageError;
use baton_session::turn_stream::{EventId, MAX_READ, StreamEvent, TurnStreamReader};
use baton_session::{
    CommittedState, ListQuery, ReplicaView, SessionCatalog, SessionKey, SessionPage, SessionView,
    StoreError, TurnRecord,
};

pub type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, PageError>> + Send + 'a>>;

pub trait Catalog: Send + Sync + 'static {
    fn sessions<'a>(&'a self, query: &'a ListQuery) -> Answer<'a, SessionPage>;
    fn inspect<'a>(&'a self, key: &'a SessionKey) -> Answer<'a, Option<SessionView>>;
    fn state<'a>(&'a self, key: &'a SessionKey) -> Answer<'a, Option<CommittedState>>;
    fn turns<'a>(&'a self, key: &'a SessionKey, limit: u32) -> Answer<'a, Vec<TurnRecord>>;
    fn replicas(&self) -> Answer<'_, Vec<ReplicaView>>;
    /// The events of turn `turn_seq`'s stream after `after`, oldest first
    /// (at most [`MAX_READ`]).
    fn turn_events<'a>(
        &'a self,
        key: &'a SessionKey,
        turn_seq: u64,
        after: Option<EventId>,
    ) -> Answer<'a, Vec<StreamEvent>>;
    /// Asks the replica running turn `turn_seq` to keep its stream in the
    /// store (it keeps none until someone wants it); `false` when that
    /// turn no longer runs.
    fn want_turn_events<'a>(&'a self, key: &'a SessionKey, turn_seq: u64) -> Answer<'a, bool>;
}

/// The page's message for a store error; the log keeps the detail.
fn for_page(what: &'static str) -> impl Fn(StoreError) -> PageError {
    move |e| {
        tracing::warn!(error = %e, "dashboard: {what} failed");
        PageError::Store {
            what,
            kind: e.metric_label(),
        }
    }
}

impl<T: SessionCatalog + TurnStreamReader + 'static> Catalog for T {
    fn sessions<'a>(&'a self, query: &'a ListQuery) -> Answer<'a, SessionPage> {
        Box::pin(async move {
            self.list_sessions(query)
                .await
                .map_err(for_page("listing sessions"))
        })
    }

    fn inspect<'a>(&'a self, key: &'a SessionKey) -> Answer<'a, Option<SessionView>> {
        Box::pin(async move {
            SessionCatalog::inspect(self, key)
                .await
                .map_err(for_page("reading the session"))
        })
    }

    fn state<'a>(&'a self, key: &'a SessionKey) -> Answer<'a, Option<CommittedState>> {
        Box::pin(async move {
            self.inspect_state(key)
                .await
                .map_err(for_page("reading the session's state"))
        })
    }

    fn turns<'a>(&'a self, key: &'a SessionKey, limit: u32) -> Answer<'a, Vec<TurnRecord>> {
        Box::pin(async move {
            SessionCatalog::turns(self, key, limit)
                .await
                .map_err(for_page("reading the turn history"))
        })
    }

    fn replicas(&self) -> Answer<'_, Vec<ReplicaView>> {
        Box::pin(async move {
            SessionCatalog::replicas(self)
                .await
                .map_err(for_page("listing replicas"))
        })
    }

    fn turn_events<'a>(
        &'a self,
        key: &'a SessionKey,
        turn_seq: u64,
        after: Option<EventId>,
    ) -> Answer<'a, Vec<StreamEvent>> {
        Box::pin(async move {
            self.read_events(key, turn_seq, after, MAX_READ)
                .await
                .map_err(for_page("reading the running turn's stream"))
        })
    }

    fn want_turn_events<'a>(&'a self, key: &'a SessionKey, turn_seq: u64) -> Answer<'a, bool> {
        Box::pin(async move {
            self.want_events(key, turn_seq)
                .await
                .map_err(for_page("asking for the running turn's stream"))
        })
    }
}

/// The catalog of a dashboard that reads no stores: `--kubernetes` alone
/// (the Helm chart without `dashboard.agentDeployment`) shows the cluster's
/// `AgentDeployment`s on the replicas page, and says on the session pages
/// how to choose one.
pub struct NoStores;

impl Catalog for NoStores {
    fn sessions<'a>(&'a self, _: &'a ListQuery) -> Answer<'a, SessionPage> {
        Box::pin(async { Err(PageError::NoStores) })
    }

    fn inspect<'a>(&'a self, _: &'a SessionKey) -> Answer<'a, Option<SessionView>> {
        Box::pin(async { Err(PageError::NoStores) })
    }

    fn state<'a>(&'a self, _: &'a SessionKey) -> Answer<'a, Option<CommittedState>> {
        Box::pin(async { Err(PageError::NoStores) })
    }

    fn turns<'a>(&'a self, _: &'a SessionKey, _: u32) -> Answer<'a, Vec<TurnRecord>> {
        Box::pin(async { Err(PageError::NoStores) })
    }

    fn replicas(&self) -> Answer<'_, Vec<ReplicaView>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn turn_events<'a>(
        &'a self,
        _: &'a SessionKey,
        _: u64,
        _: Option<EventId>,
    ) -> Answer<'a, Vec<StreamEvent>> {
        Box::pin(async { Err(PageError::NoStores) })
    }

    fn want_turn_events<'a>(&'a self, _: &'a SessionKey, _: u64) -> Answer<'a, bool> {
        Box::pin(async { Err(PageError::NoStores) })
    }
}
