//! The replicas that are alive, from the heartbeat index.

use std::time::Duration;

use redis::AsyncCommands as _;

use baton_session::ids::SessionKey;

use crate::errors::{millis, unavailable};
use crate::store::RedisStore;
use baton_session::store::{StoreError, StoreResult};
use baton_session::turn_record;

impl RedisStore {
    /// See [`crate::TurnStore::claim_layout`]: a `SET NX` of the layout
    /// key, and with `adopt` a `SET` once every live replica says `mine`.
    pub async fn claim_layout(&self, mine: u32, adopt: bool) -> StoreResult<u32> {
        let mut conn = self.conn.clone();
        let key = self.space.layout();
        let recorded: Option<u32> = redis::cmd("SET")
            .arg(&key)
            .arg(mine)
            .arg("NX")
            .arg("GET")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Some(recorded) = recorded else {
            return Ok(mine);
        };
        if recorded == mine || !adopt {
            return Ok(recorded);
        }
        let others = self
            .replicas()
            .await?
            .into_iter()
            .filter(|r| r.info.layout != Some(mine))
            .count();
        if others > 0 {
            return Ok(recorded);
        }
        let () = redis::cmd("SET")
            .arg(&key)
            .arg(mine)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        tracing::warn!(
            from = recorded,
            to = mine,
            "the stores now hold this build's data layout"
        );
        Ok(mine)
    }

    /// Replicas whose heartbeat key is alive, with when they last beat:
    /// the replica index names the candidates (no keyspace walk), their
    /// heartbeat keys decide. Two round trips, whatever the keyspace holds
    /// (on a cluster, the second is one request per replica, at once).
    pub async fn replicas(&self) -> StoreResult<Vec<baton_session::model::ReplicaView>> {
        let mut conn = self.conn.clone();
        let now = turn_record::now_ms();
        // Clocks differ between replicas: candidates are those whose
        // expiry is at most a while ago by this clock; the key decides.
        let mut names: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.space.replicas())
            .arg(now.saturating_sub(60_000))
            .arg("+inf")
            .arg("BYSCORE")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        names.sort();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let (seen, infos): (Vec<Option<u64>>, Vec<Option<String>>) = if self.space.is_clustered() {
            // Each replica's two keys share a slot of their own: a pipeline
            // per replica, all at once.
            let reads = names
                .iter()
                .map(|n| {
                    let mut pipe = redis::pipe();
                    pipe.get(self.space.heartbeat(n))
                        .get(self.space.heartbeat_info(n));
                    let mut conn = self.conn.clone();
                    async move {
                        pipe.query_async::<(Option<u64>, Option<String>)>(&mut conn)
                            .await
                    }
                })
                .collect::<Vec<_>>();
            futures::future::try_join_all(reads)
                .await
                .map_err(unavailable)?
                .into_iter()
                .unzip()
        } else {
            let keys: Vec<String> = names.iter().map(|n| self.space.heartbeat(n)).collect();
            let info_keys: Vec<String> =
                names.iter().map(|n| self.space.heartbeat_info(n)).collect();
            redis::pipe()
                .mget(&keys)
                .mget(&info_keys)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?
        };
        let mut replicas = Vec::new();
        for ((id, seen), info) in names.into_iter().zip(seen).zip(infos) {
            if let Some(last_seen_ms) = seen {
                replicas.push(baton_session::model::ReplicaView {
                    info: baton_session::store::replica_info(&id, info.as_deref())?,
                    id,
                    last_seen_ms,
                });
            }
        }
        Ok(replicas)
    }
}

impl RedisStore {
    /// A heartbeat on a cluster: first every master's run (which also
    /// says which master serves which bucket), then at once the replica's
    /// own keys (one slot), the replica index (another) and a copy of the
    /// heartbeat on every master. It holds if any master took it: a failed
    /// master (its replica not yet in charge) must not make this replica
    /// look gone to the sessions of the others. `beat` is the single-server
    /// pipeline: own keys (2 commands), then the index (2).
    pub(crate) async fn cluster_heartbeat(
        &self,
        beat: &redis::Pipeline,
        replica: &str,
        now: u64,
        ttl: Duration,
    ) -> StoreResult<()> {
        let runs = self.run.refresh(&self.conn).await;
        let mut own = redis::pipe();
        for command in beat.cmd_iter().take(2) {
            own.add_command(command.clone()).ignore();
        }
        let mut index = redis::pipe();
        for command in beat.cmd_iter().skip(2) {
            index.add_command(command.clone()).ignore();
        }
        let mut writes = vec![own, index];
        for home in self.run.homes() {
            let mut copy = redis::pipe();
            copy.pset_ex(self.space.heartbeat_copy(home, replica), now, millis(ttl))
                .ignore();
            writes.push(copy);
        }
        let sends: Vec<_> = writes
            .iter()
            .map(|pipe| {
                let mut conn = self.conn.clone();
                async move { pipe.query_async::<()>(&mut conn).await }
            })
            .collect();
        let results = futures::future::join_all(sends).await;
        let failed: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(ToString::to_string))
            .collect();
        if failed.len() == results.len() {
            return Err(StoreError::Unavailable(failed.join("; ")));
        }
        if !failed.is_empty() {
            tracing::warn!(errors = %failed.join("; "), "part of a heartbeat failed (a cluster master is down?)");
        }
        if let Err(e) = runs {
            tracing::debug!(error = %e, "reading the cluster's runs failed; the hints stay as they were");
        }
        Ok(())
    }

    /// Whether `replica`'s heartbeat is alive, as the master serving
    /// `key` knows it. On a cluster every replica keeps a copy of its
    /// heartbeat on every master, so a session's failover reads the master
    /// that serves the session (the one that just answered BUSY), and a
    /// master that fails leaves the other masters' sessions to fail over
    /// as before. A missing copy is checked against the replica's own key
    /// (the copy may not be written yet: a new master, a slot moved since
    /// the last heartbeat); when that key's master does not answer, the
    /// copy decides.
    pub(crate) async fn is_alive(&self, replica: &str, key: &SessionKey) -> StoreResult<bool> {
        let mut conn = self.conn.clone();
        let own = conn.exists(self.space.heartbeat(replica));
        if !self.space.is_clustered() {
            return own.await.map_err(unavailable);
        }
        let home = self.run.home(self.space.bucket_of_key(key));
        let copy: bool = self
            .conn
            .clone()
            .exists(self.space.heartbeat_copy(home, replica))
            .await
            .map_err(unavailable)?;
        if copy {
            return Ok(true);
        }
        Ok(own.await.unwrap_or(false))
    }
}
