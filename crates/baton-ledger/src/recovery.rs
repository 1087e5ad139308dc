//! What the ledger decides when Redis has no state for a session (G7), or
//! a state a restarted Redis may hold older than it acknowledged.

use bytes::Bytes;

use baton_session::durable::{DurableCopy, LedgerSession};
use baton_session::ids::SessionKey;

use crate::store::RedisLedgerStore;
use baton_session::model::{BeginOutcome, BeginRequest};
use baton_session::store::{StoreError, StoreResult};
use baton_session::turn_record::now_ms;
use baton_store_redis::{OnMissing, RawBegin};

/// What the ledger makes of a session Redis has no state for.
pub(crate) enum Recovery {
    /// Refuse the turn with this (STATE_LOST).
    Answer(BeginOutcome),
    /// Restored from the ledger, or somebody changed the state first.
    BeginAgain,
    /// Unknown to the ledger too: a new session.
    New,
}

impl RedisLedgerStore {
    /// A begin whose missing or unvouched state the ledger judges first:
    /// the production store's `TurnStore::begin`.
    pub(crate) async fn begin_judged(&self, req: &BeginRequest) -> StoreResult<BeginOutcome> {
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

    /// The ledger's answer for a session Redis (as run `judged_in`) has no
    /// state for.
    pub(crate) async fn recover(
        &self,
        req: &BeginRequest,
        judged_in: &str,
    ) -> StoreResult<Recovery> {
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
    pub(crate) async fn check_against_ledger(
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
    pub(crate) async fn vouch_for_commit(
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
    pub(crate) async fn restore_from(
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
