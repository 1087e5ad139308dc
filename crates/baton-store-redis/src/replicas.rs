//! The replicas that are alive, from the heartbeat index.

use crate::{RedisStore, unavailable};
use baton_session::store::StoreResult;
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
