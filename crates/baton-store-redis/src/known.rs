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
//! On a Redis Cluster every master has its own run and fails over on its
//! own, so each bucket of sessions (`slots.rs`) has its own watermark,
//! beside its sessions, naming the run of the master that serves it: a
//! failover sends only that master's buckets back to the ledger until the
//! next backfill.
//!
//! Every replica writing to one Redis must be of a build that sets
//! markers: an older build commits without one.

use futures::{StreamExt as _, TryStreamExt as _};
use redis::AsyncCommands;

use crate::errors::{corrupt, unavailable};
use crate::keys::KeySpace;
use crate::runs::run_id;
use crate::store::RedisStore;
use baton_session::ids::SessionKey;
use baton_session::store::{StoreError, StoreResult};

/// Index entries read per ZSCAN call of the backfill.
const SCAN_COUNT: usize = 1000;

/// What the sweeper reads before it maintains the index.
#[derive(Debug)]
pub struct KnownIndexCheck {
    /// The Redis run answering for each bucket now (one bucket on a single
    /// server; on a cluster, the run of the master serving it).
    pub runs: Vec<String>,
    /// The `maxmemory-policy` (on a cluster, the first master's that may
    /// evict markers, if any does).
    pub eviction_policy: String,
}

impl KnownIndexCheck {
    /// `allkeys-lru`, `allkeys-lfu`, `allkeys-random` may evict a marker.
    pub fn may_evict_markers(&self) -> bool {
        self.eviction_policy.starts_with("allkeys")
    }
}

impl KeySpace {
    /// The marker of the session an unshipped-index member names.
    fn known_marker_of_member(&self, member: &str) -> String {
        self.key_of_member(member, ":known")
    }
}

/// Watermarks read or written at once on a cluster.
const PARALLEL_WATERMARKS: usize = 64;

fn eviction_policy(memory: &str) -> StoreResult<String> {
    memory
        .lines()
        .find_map(|l| l.strip_prefix("maxmemory_policy:"))
        .map(|p| p.trim().to_owned())
        .ok_or_else(|| corrupt("INFO memory has no maxmemory_policy"))
}

impl RedisStore {
    /// Whether the known index of `key`'s bucket is complete in the Redis
    /// run `run` (the run that answered MISSING for `key`).
    pub async fn known_index_complete_in(&self, key: &SessionKey, run: &str) -> StoreResult<bool> {
        let complete: Option<String> = self
            .conn
            .clone()
            .get(self.space.known_complete(self.space.bucket_of_key(key)))
            .await
            .map_err(unavailable)?;
        Ok(complete.as_deref() == Some(run))
    }

    /// The runs and the eviction policy: one round trip on a single
    /// server, two plus one per master on a cluster.
    pub async fn known_index_check(&self) -> StoreResult<KnownIndexCheck> {
        if self.space.is_clustered() {
            let topology = crate::runs::read_topology(&self.conn).await?;
            let runs = (0..self.space.buckets())
                .map(|b| topology.run_of_bucket(b).map(|r| r.to_string()))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| {
                    StoreError::Unavailable("a cluster slot has no master that answers".into())
                })?;
            // Every master that answers; any that may evict decides.
            let mut policy = None;
            for (_, text) in
                crate::runs::info_of_every_master(&self.conn, &topology, "memory").await
            {
                let this = eviction_policy(&text)?;
                if policy.is_none() || this.starts_with("allkeys") {
                    policy = Some(this);
                }
            }
            return Ok(KnownIndexCheck {
                runs,
                eviction_policy: policy.unwrap_or_default(),
            });
        }
        // Two single-section INFOs: several sections in one INFO need Redis 7.
        let (server, memory): (String, String) = redis::pipe()
            .cmd("INFO")
            .arg("server")
            .cmd("INFO")
            .arg("memory")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(KnownIndexCheck {
            runs: vec![run_id(&server)?],
            eviction_policy: eviction_policy(&memory)?,
        })
    }

    /// Whether every bucket's watermark names the run in `runs` (the
    /// bucket's run now).
    pub async fn known_index_complete_for(&self, runs: &[String]) -> StoreResult<bool> {
        let reads = runs
            .iter()
            .enumerate()
            .map(|(bucket, run)| {
                let mut conn = self.conn.clone();
                let key = self
                    .space
                    .known_complete(u16::try_from(bucket).unwrap_or_default());
                async move {
                    let complete: Option<String> = conn.get(key).await?;
                    Ok::<_, redis::RedisError>(complete.as_deref() == Some(run.as_str()))
                }
            })
            .collect::<Vec<_>>();
        let complete: Vec<bool> = futures::stream::iter(reads)
            .buffer_unordered(PARALLEL_WATERMARKS)
            .try_collect()
            .await
            .map_err(unavailable)?;
        Ok(complete.iter().all(|c| *c))
    }

    /// Removes the watermarks: new sessions ask the ledger again.
    pub async fn drop_known_index(&self) -> StoreResult<()> {
        let deletes = (0..self.space.buckets())
            .map(|bucket| {
                let mut conn = self.conn.clone();
                let key = self.space.known_complete(bucket);
                async move { conn.del::<_, i64>(key).await }
            })
            .collect::<Vec<_>>();
        futures::stream::iter(deletes)
            .buffer_unordered(PARALLEL_WATERMARKS)
            .try_collect::<Vec<i64>>()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// One page of bucket `bucket`'s unshipped index members and the
    /// cursor of the next (0 at the end). ZSCAN returns every member
    /// present from the first call to the last at least once, whatever
    /// changes meanwhile.
    pub async fn unshipped_members_page(
        &self,
        bucket: u16,
        cursor: u64,
    ) -> StoreResult<(u64, Vec<String>)> {
        let (next, flat): (u64, Vec<String>) = redis::cmd("ZSCAN")
            .arg(self.space.unshipped(bucket))
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
    pub async fn mark_known_members(&self, members: &[String]) -> StoreResult<()> {
        let markers: Vec<(u16, String)> = members
            .iter()
            .map(|m| {
                (
                    self.space.bucket_of_member(m),
                    self.space.known_marker_of_member(m),
                )
            })
            .collect();
        self.set_markers(markers).await
    }

    /// Sets the markers of `keys`.
    pub async fn mark_known(&self, keys: &[SessionKey]) -> StoreResult<()> {
        let markers: Vec<(u16, String)> = keys
            .iter()
            .map(|k| {
                let keys = self.space.session(k);
                (keys.bucket, keys.known)
            })
            .collect();
        self.set_markers(markers).await
    }

    /// One pipeline per bucket (one slot on a cluster), the buckets at once.
    async fn set_markers(&self, markers: Vec<(u16, String)>) -> StoreResult<()> {
        let mut by_bucket: std::collections::BTreeMap<u16, redis::Pipeline> = Default::default();
        for (bucket, marker) in markers {
            by_bucket
                .entry(bucket)
                .or_insert_with(redis::pipe)
                .set(marker, "1")
                .ignore();
        }
        let writes = by_bucket
            .into_values()
            .map(|pipe| {
                let mut conn = self.conn.clone();
                async move { pipe.query_async::<()>(&mut conn).await }
            })
            .collect::<Vec<_>>();
        futures::stream::iter(writes)
            .buffer_unordered(PARALLEL_WATERMARKS)
            .try_collect::<Vec<()>>()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Writes each bucket's watermark for its run in `runs`, if Redis is
    /// still that run there (see `complete_known.lua`). True when every
    /// bucket's was written.
    pub async fn complete_known_index(&self, runs: &[String]) -> StoreResult<bool> {
        let writes = runs
            .iter()
            .enumerate()
            .map(|(bucket, run)| {
                let mut conn = self.conn.clone();
                let key = self
                    .space
                    .known_complete(u16::try_from(bucket).unwrap_or_default());
                let script = &self.scripts.complete_known;
                async move {
                    script
                        .key(key)
                        .arg(run)
                        .invoke_async::<i64>(&mut conn)
                        .await
                }
            })
            .collect::<Vec<_>>();
        let done: Vec<i64> = futures::stream::iter(writes)
            .buffer_unordered(PARALLEL_WATERMARKS)
            .try_collect()
            .await
            .map_err(unavailable)?;
        Ok(done.iter().all(|d| *d == 1))
    }
}
