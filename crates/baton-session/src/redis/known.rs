//! Telling a new session from a lost one without asking the ledger.
//!
//! When Redis has no state for a session, only the ledger could say
//! whether it is new, or was lost (its state expired, or Redis lost it):
//! every new conversation waited on Postgres, and a Postgres outage
//! refused them all. The known index answers first.
//!
//! Every ledgered commit and every restore sets the session's marker
//! (`…{tenant:session}:known`), in the script that writes the turn record,
//! so a Redis that holds a record holds its marker; markers never expire.
//! A session without a marker was never committed through this Redis,
//! *provided* the markers are complete: every session the ledger knows has
//! one in the dataset Redis holds now. That is what the watermark
//! `<prefix>:known:complete` vouches for. It names the Redis run (`INFO`
//! `run_id`, new with every start) in which one backfill marked every
//! session the unshipped index named and then every session the ledger
//! knew. A later run (a restart, which may load a dataset older than what
//! was acknowledged; a failover to a replica) finds another run's id there
//! and trusts nothing until the sweeper has backfilled it again, a few
//! pages per sweep; meanwhile new sessions ask the ledger, as before. A
//! Redis allowed to evict keys without a TTL (`maxmemory-policy
//! allkeys-*`) could evict a marker: there the index is never trusted.
//!
//! The decision, in `RedisLedgerStore::begin`: `begin.lua` answers MISSING
//! with the run and whether the marker exists; with no marker, the caller
//! GETs the watermark; if it names that run, `begin.lua` runs again and
//! creates the session only if it still has no marker and Redis is still
//! that run (so the watermark it read was written before the marker's
//! absence was seen). Three Redis round trips, no Postgres one.
//!
//! Every replica writing to one Redis must be of a build that sets
//! markers: an older build commits without one.

use redis::AsyncCommands;

use super::{KeySpace, RedisStore, corrupt, run_id, unavailable};
use crate::ids::SessionKey;
use crate::store::StoreResult;

/// Index entries read per ZSCAN call of the backfill.
const SCAN_COUNT: usize = 1000;

/// What the sweeper reads before it maintains the index.
#[derive(Debug)]
pub(crate) struct KnownIndexCheck {
    /// The Redis run answering now.
    pub run: String,
    /// Its `maxmemory-policy`.
    pub eviction_policy: String,
    /// The run the watermark names, if there is one.
    pub complete_for: Option<String>,
}

impl KnownIndexCheck {
    /// `allkeys-lru`, `allkeys-lfu`, `allkeys-random` may evict a marker.
    pub fn may_evict_markers(&self) -> bool {
        self.eviction_policy.starts_with("allkeys")
    }

    pub fn is_complete(&self) -> bool {
        !self.may_evict_markers() && self.complete_for.as_deref() == Some(self.run.as_str())
    }
}

impl KeySpace {
    /// The known index's watermark: the run it is complete for.
    pub fn known_complete(&self) -> String {
        format!("{}:known:complete", self.prefix)
    }

    /// The marker of the session an unshipped-index member names.
    fn known_marker_of_member(&self, member: &str) -> String {
        self.key_of_member(member, ":known")
    }
}

impl RedisStore {
    /// Whether the known index is complete in the Redis run `run`.
    pub(crate) async fn known_index_complete_in(&self, run: &str) -> StoreResult<bool> {
        let complete: Option<String> = self
            .conn
            .clone()
            .get(self.space.known_complete())
            .await
            .map_err(unavailable)?;
        Ok(complete.as_deref() == Some(run))
    }

    /// The run, its eviction policy and the watermark, in one round trip.
    pub(crate) async fn known_index_check(&self) -> StoreResult<KnownIndexCheck> {
        // Two single-section INFOs: several sections in one INFO need Redis 7.
        let (server, memory, complete_for): (String, String, Option<String>) = redis::pipe()
            .cmd("INFO")
            .arg("server")
            .cmd("INFO")
            .arg("memory")
            .get(self.space.known_complete())
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let eviction_policy = memory
            .lines()
            .find_map(|l| l.strip_prefix("maxmemory_policy:"))
            .map(|p| p.trim().to_owned())
            .ok_or_else(|| corrupt("INFO memory has no maxmemory_policy"))?;
        Ok(KnownIndexCheck {
            run: run_id(&server)?,
            eviction_policy,
            complete_for,
        })
    }

    /// Removes the watermark: new sessions ask the ledger again.
    pub(crate) async fn drop_known_index(&self) -> StoreResult<()> {
        let _: i64 = self
            .conn
            .clone()
            .del(self.space.known_complete())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// One page of the unshipped index's members and the cursor of the
    /// next (0 at the end). ZSCAN returns every member present from the
    /// first call to the last at least once, whatever changes meanwhile.
    pub(crate) async fn unshipped_members_page(
        &self,
        cursor: u64,
    ) -> StoreResult<(u64, Vec<String>)> {
        let (next, flat): (u64, Vec<String>) = redis::cmd("ZSCAN")
            .arg(self.space.unshipped())
            .arg(cursor)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        // Member, score, member, score, ...
        Ok((next, flat.into_iter().step_by(2).collect()))
    }

    /// Sets the markers of the sessions the unshipped index names.
    pub(crate) async fn mark_known_members(&self, members: &[String]) -> StoreResult<()> {
        let markers: Vec<String> = members
            .iter()
            .map(|m| self.space.known_marker_of_member(m))
            .collect();
        self.set_markers(&markers).await
    }

    /// Sets the markers of `keys`.
    pub(crate) async fn mark_known(&self, keys: &[SessionKey]) -> StoreResult<()> {
        let markers: Vec<String> = keys.iter().map(|k| self.space.session(k).known).collect();
        self.set_markers(&markers).await
    }

    async fn set_markers(&self, markers: &[String]) -> StoreResult<()> {
        if markers.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for marker in markers {
            pipe.set(marker, "1").ignore();
        }
        pipe.query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    /// Writes the watermark for `run`, if Redis is still that run (see
    /// `complete_known.lua`). True when it did.
    pub(crate) async fn complete_known_index(&self, run: &str) -> StoreResult<bool> {
        let done: i64 = self
            .scripts
            .complete_known
            .key(self.space.known_complete())
            .arg(run)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(done == 1)
    }
}
