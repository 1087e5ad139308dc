//! What the ledger shipper and the sweeper read and write in Redis: the
//! unshipped turn records of sessions, the index of sessions that may have
//! some, and the leases of work one replica does for all (the sweeper, the
//! workspace collector).

use std::time::Duration;

use bytes::Bytes;
use redis::{AsyncCommands, Value};

use crate::errors::{corrupt, millis, parse_error, unavailable};
use crate::keys::session_of_member;
use crate::store::RedisStore;
use baton_session::ids::SessionKey;
use baton_session::store::StoreResult;
use baton_session::turn_record;

/// An entry of an unshipped index as the sweeper read it.
#[derive(Clone, Debug)]
pub struct Unshipped {
    pub key: SessionKey,
    /// The bucket whose index holds it.
    pub bucket: u16,
    pub member: String,
    /// The score as Redis printed it: compared as text by `unindex.lua`.
    pub score: String,
}

/// Bucket indexes a sweep on a cluster reads in one request per master
/// (each answers up to the sweep's limit of entries).
const BUCKET_READS_PER_REQUEST: usize = 256;

type ShipReadout = (
    Vec<String>,
    (Option<u64>, Option<String>, Option<String>),
    Option<Vec<u8>>,
);

impl RedisStore {
    /// For each of `keys`: up to `limit` unshipped turn records and the
    /// state as it is now — all in one round trip.
    pub async fn ship_batches(
        &self,
        keys: &[SessionKey],
        limit: usize,
    ) -> StoreResult<Vec<baton_session::durable::ShipBatch>> {
        let end = isize::try_from(limit).unwrap_or(isize::MAX) - 1;
        // MULTI/EXEC: each session's version and payload read at one
        // instant. One transaction per bucket (one slot on a cluster: a
        // transaction may not cross slots), one request per master.
        let groups = self.group_by_bucket(keys, |k| k);
        let reads: Vec<redis::Pipeline> = groups
            .iter()
            .map(|(_, members)| {
                let mut pipe = redis::pipe();
                pipe.atomic();
                for &i in members {
                    let k = self.space.session(&keys[i]);
                    pipe.lrange(&k.log, 0, end)
                        .hmget(&k.state, &["version", "ws", "run"])
                        .get(&k.payload);
                }
                pipe
            })
            .collect();
        let answers = self
            .conn
            .query_each::<Vec<Value>>(&reads)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        let mut replies: Vec<Option<&[Value]>> = vec![None; keys.len()];
        for ((_, members), answer) in groups.iter().zip(&answers) {
            if answer.len() != members.len() * 3 {
                return Err(corrupt(format!(
                    "shipping read: {} replies for {} sessions",
                    answer.len(),
                    members.len()
                )));
            }
            for (&i, reply) in members.iter().zip(answer.chunks(3)) {
                replies[i] = Some(reply);
            }
        }
        let mut batches = Vec::with_capacity(keys.len());
        for (key, reply) in keys.iter().zip(replies) {
            let reply = reply.ok_or_else(|| corrupt("shipping read: a session without a reply"))?;
            let (raw, (version, workspace, run), payload): ShipReadout = (
                redis::from_redis_value_ref(&reply[0]).map_err(parse_error)?,
                redis::from_redis_value_ref(&reply[1]).map_err(parse_error)?,
                redis::from_redis_value_ref(&reply[2]).map_err(parse_error)?,
            );
            let records = raw
                .iter()
                .map(|r| serde_json::from_str(r).map_err(|e| corrupt(format!("turn record: {e}"))))
                .collect::<StoreResult<Vec<baton_session::model::TurnRecord>>>()?;
            let durable = match (version, payload) {
                (None, _) => None,
                // A session that never committed has no payload.
                (Some(0), _) => Some(baton_session::durable::DurableCopy {
                    version: 0,
                    payload: Bytes::new(),
                    workspace: None,
                }),
                (Some(version), Some(payload)) => Some(baton_session::durable::DurableCopy {
                    version,
                    payload: Bytes::from(payload),
                    workspace: workspace.filter(|w| !w.is_empty()),
                }),
                // Never an empty copy the ledger would vouch for: the sweep
                // skips this session (and says so) until it is mended.
                (Some(version), None) => {
                    return Err(corrupt(format!(
                        "{key}: version {version} has no payload; not shipping it as an empty copy"
                    )));
                }
            };
            batches.push(baton_session::durable::ShipBatch {
                key: key.clone(),
                records,
                durable,
                run: run.filter(|r| !r.is_empty()),
            });
        }
        Ok(batches)
    }

    /// Drops from each batch's session log the records the batch shipped,
    /// in one round trip; how many each dropped. Records are named by
    /// turnSeq and fence, and only those are dropped (see `ack.lua`): a
    /// record the batch did not hold stays to be shipped, whatever its
    /// turnSeq.
    pub async fn ack_shipped(
        &self,
        batches: &[baton_session::durable::ShipBatch],
    ) -> StoreResult<Vec<u64>> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        // One pipeline per bucket (one slot on a cluster), one request per
        // master; `ack.lua` run twice drops nothing more. (A pipeline that
        // ran in part while its slot migrated is sent again whole and
        // reports 0 for what its first run dropped: the round then asks
        // for no more of that session, and the next sweep looks again.)
        let groups = self.group_by_bucket(batches, |b| &b.key);
        let acks: Vec<redis::Pipeline> = groups
            .iter()
            .map(|(_, members)| {
                let mut pipe = redis::pipe();
                for &i in members {
                    let batch = &batches[i];
                    let mut invocation = self.scripts.ack.prepare_invoke();
                    invocation.key(self.space.session(&batch.key).log);
                    for record in &batch.records {
                        invocation
                            .arg(record.turn_seq.to_string())
                            .arg(record.fence.to_string());
                    }
                    pipe.invoke_script(&invocation);
                }
                pipe
            })
            .collect();
        let answers: Vec<Vec<u64>> = self.conn.with_script_each(&self.scripts.ack, &acks).await?;
        let mut dropped = vec![0; batches.len()];
        for ((_, members), answer) in groups.iter().zip(answers) {
            for (&i, n) in members.iter().zip(answer) {
                dropped[i] = n;
            }
        }
        Ok(dropped)
    }

    /// Up to `limit` indexed sessions whose last indexing commit is older
    /// than `older_than_ms` (ms): the woken shipper had its chance at them.
    pub async fn unshipped(&self, older_than_ms: u64, limit: usize) -> StoreResult<Vec<Unshipped>> {
        let before = turn_record::now_ms().saturating_sub(older_than_ms);
        // Every bucket's index (one on a single server, one per bucket on a
        // cluster: one request per master for a chunk of buckets).
        let mut pages: Vec<(u16, Vec<(String, String)>)> = Vec::new();
        let buckets: Vec<u16> = (0..self.space.buckets()).collect();
        for chunk in buckets.chunks(BUCKET_READS_PER_REQUEST) {
            let reads: Vec<redis::Pipeline> = chunk
                .iter()
                .map(|&bucket| {
                    let mut pipe = redis::pipe();
                    pipe.cmd("ZRANGE")
                        .arg(self.space.unshipped(bucket))
                        .arg("-inf")
                        .arg(before)
                        .arg("BYSCORE")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(limit)
                        .arg("WITHSCORES");
                    pipe
                })
                .collect();
            for (&bucket, read) in chunk.iter().zip(
                self.conn
                    .query_each::<(Vec<(String, String)>,)>(&reads)
                    .await,
            ) {
                let (entries,) = read.map_err(unavailable)?;
                pages.push((bucket, entries));
            }
        }
        pages.sort_by_key(|(bucket, _)| *bucket);
        let mut found = Vec::new();
        for (bucket, entries) in pages {
            for (member, score) in entries {
                if found.len() >= limit {
                    break;
                }
                match session_of_member(&member) {
                    Some(key) => found.push(Unshipped {
                        key,
                        bucket,
                        member,
                        score,
                    }),
                    None => {
                        // Not an entry this code writes: drop it, say so.
                        tracing::warn!(%member, "dropping an unshipped-index entry that names no session");
                        let _: i64 = self
                            .conn
                            .clone()
                            .zrem(self.space.unshipped(bucket), &member)
                            .await
                            .map_err(unavailable)?;
                    }
                }
            }
        }
        Ok(found)
    }

    /// The workspace of every session the unshipped index names: states
    /// whose commits the ledger's durable copies may not have yet.
    pub async fn unshipped_workspaces(&self) -> StoreResult<Vec<String>> {
        let mut found = Vec::new();
        for bucket in 0..self.space.buckets() {
            let mut cursor = 0;
            loop {
                let (next, members) = self.unshipped_members_page(bucket, cursor).await?;
                if !members.is_empty() {
                    let mut pipe = redis::pipe();
                    for member in &members {
                        pipe.hget(self.space.key_of_member(member, ":state"), "ws");
                    }
                    let workspaces: Vec<Option<String>> = pipe
                        .query_async(&mut self.conn.clone())
                        .await
                        .map_err(unavailable)?;
                    found.extend(workspaces.into_iter().flatten().filter(|w| !w.is_empty()));
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(found)
    }

    /// How many records each session's log holds, in one round trip (per
    /// master on a cluster).
    pub async fn log_lengths(&self, keys: &[&SessionKey]) -> StoreResult<Vec<u64>> {
        let groups = self.group_by_bucket(keys, |k| k);
        let reads: Vec<redis::Pipeline> = groups
            .iter()
            .map(|(_, members)| {
                let mut pipe = redis::pipe();
                for &i in members {
                    pipe.llen(self.space.session(keys[i]).log);
                }
                pipe
            })
            .collect();
        let answers = self
            .conn
            .query_each::<Vec<u64>>(&reads)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        let mut lengths = vec![0; keys.len()];
        for ((_, members), answer) in groups.iter().zip(answers) {
            for (&i, n) in members.iter().zip(answer) {
                lengths[i] = n;
            }
        }
        Ok(lengths)
    }

    /// Drops `entries` (whose logs were found empty) from the index, each
    /// unless a commit re-indexed it since it was read (`unindex.lua`).
    pub async fn unindex(&self, entries: &[&Unshipped]) -> StoreResult<u64> {
        let mut by_bucket: std::collections::BTreeMap<u16, Vec<&Unshipped>> = Default::default();
        for entry in entries {
            by_bucket.entry(entry.bucket).or_default().push(entry);
        }
        let mut dropped = 0;
        for (bucket, entries) in by_bucket {
            let mut invocation = self.scripts.unindex.prepare_invoke();
            invocation.key(self.space.unshipped(bucket));
            for entry in entries {
                invocation.arg(&entry.member).arg(&entry.score);
            }
            dropped += invocation
                .invoke_async::<u64>(&mut self.conn.clone())
                .await
                .map_err(unavailable)?;
        }
        Ok(dropped)
    }

    /// Takes or keeps the sweeper lease for `holder`; false while another
    /// shipper holds it.
    pub async fn sweeper_lease(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        self.singleton_lease(&self.space.sweeper(), holder, ttl)
            .await
    }

    /// Takes or keeps the workspace collector's lease for `holder`.
    pub async fn collector_lease(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        self.singleton_lease(&self.space.collector(), holder, ttl)
            .await
    }

    /// Takes or keeps the lease `lease` of work one holder does at a time
    /// (`sweeper.lua`).
    async fn singleton_lease(&self, lease: &str, holder: &str, ttl: Duration) -> StoreResult<bool> {
        let held: i64 = self
            .scripts
            .sweeper
            .key(lease)
            .arg(holder)
            .arg(millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(held == 1)
    }

    /// Once per Redis: indexes the logs written before the index existed
    /// (one SCAN, the only walk of the keyspace left). Returns how many it
    /// found; 0 once done.
    pub async fn backfill_unshipped(&self) -> StoreResult<usize> {
        // The cluster layout came with the index: nothing predates it.
        if self.space.is_clustered() {
            return Ok(0);
        }
        let mut conn = self.conn.clone();
        let done: bool = conn
            .exists(self.space.backfilled())
            .await
            .map_err(unavailable)?;
        if done {
            return Ok(0);
        }
        let mut members = Vec::new();
        let mut iter: redis::AsyncIter<String> = conn
            .scan_options(
                redis::ScanOptions::default()
                    .with_pattern(format!("{}:{{*}}:log", self.space.prefix))
                    .with_count(1000),
            )
            .await
            .map_err(unavailable)?;
        while let Some(item) = iter.next_item().await {
            let name = item.map_err(unavailable)?;
            if let Some(inner) = name
                .strip_prefix(self.space.prefix.as_str())
                .and_then(|n| n.strip_prefix(":{"))
                .and_then(|n| n.strip_suffix("}:log"))
            {
                members.push(inner.to_owned());
            }
        }
        drop(iter);
        let mut pipe = redis::pipe();
        for chunk in members.chunks(1000) {
            // Score 0: older than anything, swept first. NX: an entry a
            // commit made keeps its score.
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(self.space.unshipped(0)).arg("NX");
            for member in chunk {
                zadd.arg(0).arg(member);
            }
            pipe.add_command(zadd).ignore();
        }
        pipe.set(self.space.backfilled(), turn_record::now_ms())
            .ignore();
        let () = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        Ok(members.len())
    }
}
