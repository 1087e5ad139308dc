//! Keeping Redis's known-session index complete after every Redis start,
//! so that a brand-new session need not wait for the ledger (see
//! `baton-store-redis`'s `known.rs`).

use std::collections::BTreeSet;

use baton_session::ids::SessionKey;

use crate::shipper::{BackfillStep, KnownBackfill, KnownSettled};
use crate::store::RedisLedgerStore;
use baton_session::model::{ListQuery, MAX_PAGE};
use baton_session::store::StoreResult;

/// Sessions the known-index backfill marks per sweep, at most, so that
/// shipping goes on between its pages.
pub(crate) const KNOWN_BACKFILL_PER_SWEEP: usize = 20_000;

impl RedisLedgerStore {
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
}
