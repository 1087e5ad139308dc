//! The steps a store with a ledger builds on (`baton-ledger`'s
//! `RedisLedgerStore`): a begin that reports a missing or unverified state
//! instead of deciding, a commit that accepts only this Redis run's
//! leases, restoring a session from its durable copy, and vouching for a
//! state the ledger confirmed.

use std::time::Duration;

use redis::Value;

use baton_session::ids::SessionKey;
use baton_session::model::{BeginOutcome, BeginRequest, CommitOutcome, CommitRequest};
use baton_session::store::{StoreError, StoreResult};
use baton_session::turn_record;

use crate::errors::{corrupt, millis, unavailable};
use crate::keys::{digest_slot, record_slot, unshipped_member};
use crate::raw::{LeaseRun, OnMissing, RawBegin, RawCommit};
use crate::reply::Reply;
use crate::store::{FRACTION_STEPS, LOG_TTL_MS, RedisStore, STAGED_TTL_MS, rand_fraction};

impl RedisStore {
    /// `commit.lua`; in this-run mode, a lease on a state another Redis run
    /// vouched for is [`RawCommit::Unverified`].
    pub async fn commit_with(
        &self,
        req: &CommitRequest,
        accepted: LeaseRun,
    ) -> StoreResult<RawCommit> {
        baton_session::store::check_commit(req)?;
        let keys = self.space.session(&req.lease.key);
        // Everything the script would otherwise compute in Lua is computed
        // here; the commit time is this replica's clock.
        let now_ms = turn_record::now_ms();
        let record = serde_json::to_string(&turn_record::record(req, now_ms))
            .map_err(|e| corrupt(format!("turn record: {e}")))?;
        let new_version = req.expected_version + 1;
        let turn_seq = req.lease.turn_seq;
        let mut result = format!("{turn_seq}\n{new_version}\n").into_bytes();
        result.extend_from_slice(&req.reply);
        let mut invocation = self.scripts.commit.prepare_invoke();
        let staged = keys.staged(req.lease.fence);
        invocation
            .key(&keys.state)
            .key(&keys.log)
            .key(&keys.payload)
            .key(&staged)
            .key(&keys.known)
            .arg(req.lease.fence.to_string())
            .arg(req.expected_version.to_string())
            .arg(new_version.to_string())
            .arg(req.workspace.clone().unwrap_or_default())
            .arg(result)
            .arg(millis(req.state_ttl))
            .arg(record)
            .arg(record_slot(turn_seq))
            .arg(now_ms.to_string())
            .arg(turn_seq.to_string())
            .arg(millis(req.state_ttl).max(LOG_TTL_MS))
            .arg(match accepted {
                LeaseRun::Any => "",
                LeaseRun::ThisRun => "this-run",
            })
            .arg(digest_slot(turn_seq))
            .arg(format!("{turn_seq}:{}", req.input_digest));
        // With a ledger, the session enters the index of unshipped logs
        // first, in the same pipeline: a record is never in a log its
        // session is not indexed for (a failed commit leaves an entry the
        // sweeper drops). The fraction makes every commit's score its own.
        let index_score = now_ms as f64 + f64::from(rand_fraction()) / f64::from(FRACTION_STEPS);
        let member = (accepted == LeaseRun::ThisRun).then(|| unshipped_member(&req.lease.key));
        let index = self.space.unshipped(keys.bucket);
        // Stage the payload with a plain SET and commit in the same round
        // trip: the bulk data never passes through Lua. A failed commit
        // deletes it; one whose script never ran leaves it for the state TTL
        // plus STAGED_TTL_MS.
        let ((), reply): ((), Vec<Value>) = self
            .conn
            .with_script(&self.scripts.commit, |pipe| {
                if let Some(member) = &member {
                    pipe.zadd(&index, member, index_score).ignore();
                }
                pipe.pset_ex(
                    &staged,
                    req.payload.as_ref(),
                    millis(req.state_ttl).saturating_add(STAGED_TTL_MS),
                )
                .invoke_script(&invocation);
            })
            .await?;
        let reply = Reply(reply);
        let outcome = match reply.text(0)?.as_str() {
            "COMMITTED" => CommitOutcome::Committed {
                version: reply.num(1)?,
            },
            "LEASE_LOST" => CommitOutcome::LeaseLost,
            "UNVERIFIED" => {
                let run = reply.text(2)?;
                self.run.set(keys.bucket, &run);
                return Ok(RawCommit::Unverified {
                    version: reply.num(1)?,
                    run,
                });
            }
            "CONFLICT" => CommitOutcome::Conflict {
                current_version: reply.num(1)?,
            },
            "CORRUPT" => {
                return Err(corrupt(format!(
                    "{}: field {} is not a number",
                    req.lease.key,
                    reply.text(1)?
                )));
            }
            "NOT_STAGED" => {
                return Err(StoreError::Unavailable(format!(
                    "{}: the staged payload vanished before the commit (Redis restarted?)",
                    req.lease.key
                )));
            }
            other => return Err(corrupt(format!("commit answered {other:?}"))),
        };
        Ok(RawCommit::Outcome(outcome))
    }

    /// `begin.lua`, plus the failover path: a holder whose heartbeat is gone
    /// is dead; its lease is taken over, but only if it is still the same lease.
    pub async fn begin_with(
        &self,
        req: &BeginRequest,
        on_missing: OnMissing<'_>,
    ) -> StoreResult<RawBegin> {
        let raw = self.begin_once(req, None, on_missing).await?;
        let RawBegin::Outcome(BeginOutcome::Busy { owner, .. }) = &raw else {
            return Ok(raw);
        };
        if owner == req.replica.as_str() || self.is_alive(owner, &req.key).await? {
            return Ok(raw);
        }
        match self.lease_fence(&req.key).await? {
            Some(fence) => self.begin_once(req, Some((owner, fence)), on_missing).await,
            None => self.begin_once(req, None, on_missing).await,
        }
    }

    /// Writes `copy` back as the session's state, with `turn_seq` as its
    /// last turnSeq, unless the session has state again (`replacing` None)
    /// or its state is no longer at the older version `replacing`, or Redis
    /// is no longer the run `judged_in` that showed the caller the state it
    /// judged. True when it restored.
    pub async fn restore(
        &self,
        known: &baton_session::durable::LedgerSession,
        copy: &baton_session::durable::DurableCopy,
        turn_seq: u64,
        state_ttl: Duration,
        replacing: Option<u64>,
        judged_in: &str,
    ) -> StoreResult<bool> {
        let keys = self.space.session(&known.key);
        let restored: Option<String> = self
            .scripts
            .restore
            .key(&keys.state)
            .key(&keys.payload)
            .key(&keys.known)
            .arg(copy.version.to_string())
            .arg(copy.payload.as_ref())
            .arg(copy.workspace.clone().unwrap_or_default())
            .arg(turn_seq.to_string())
            .arg(known.last_fence.to_string())
            .arg(&known.last_replica)
            .arg(known.last_turn_at_ms.to_string())
            .arg(millis(state_ttl))
            .arg(replacing.map(|v| v.to_string()).unwrap_or_default())
            .arg(judged_in)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(self.run.learn(keys.bucket, restored))
    }

    /// Marks the session's state, still at `version` and still in the run
    /// `judged_in`, as checked against the ledger. False when either changed.
    pub async fn vouch(
        &self,
        key: &SessionKey,
        version: u64,
        judged_in: &str,
    ) -> StoreResult<bool> {
        let keys = self.space.session(key);
        let vouched: Option<String> = self
            .scripts
            .vouch
            .key(&keys.state)
            .arg(version.to_string())
            .arg(judged_in)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(self.run.learn(keys.bucket, vouched))
    }
}
