//! The store: connecting, and the turn protocol's steps on Redis alone.

use std::time::Duration;

use bytes::Bytes;
use redis::{AsyncCommands, Value};

use baton_session::ids::{ReplicaId, SessionKey};
use baton_session::model::{
    BeginOutcome, BeginRequest, CommitOutcome, CommitRequest, CommittedState, Lease, LeaseCheck,
    LeaseView, SessionState, SessionView,
};
use baton_session::store::{StoreResult, TurnStore};

use crate::conn::Conn;
use crate::errors::{corrupt, millis, unavailable};
use crate::keys::{KeySpace, digest_slot, record_slot};
use crate::raw::{LeaseRun, OnMissing, RawBegin, RawCommit};
use crate::reply::{Reply, parse_result, reused};
use crate::runs::{RunView, run_id};
use crate::scripts::Scripts;

/// How much longer than the state a staged payload lives. The commit renames
/// it into place with its TTL, so the payload always outlives its state (by
/// at most this); a payload whose commit never ran lives the state TTL plus
/// this.
pub(crate) const STAGED_TTL_MS: u64 = 60_000;

/// `HMGET state version ws`.
pub(crate) type VersionAndWorkspace = (Option<String>, Option<String>);

/// Unshipped turn records live at least this long (a week), whatever the
/// state TTL: the ledger must get them even after a long Postgres outage.
pub(crate) const LOG_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// Replicas that stopped beating this long ago leave the replica index.
pub(crate) const REPLICA_FORGET_MS: u64 = 3_600_000;

/// A `TurnStore` on Redis alone: a session with no state is new. See
/// `baton_ledger::RedisLedgerStore` for Redis with the ledger.
/// One Redis server or a Redis Cluster (`redis+cluster://`), whichever the
/// URL names.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Conn,
    pub(crate) space: std::sync::Arc<KeySpace>,
    pub(crate) scripts: std::sync::Arc<Scripts>,
    pub(crate) run: std::sync::Arc<RunView>,
}

/// The fields of the state hash a session view shows, in this order.
pub(crate) const VIEW_FIELDS: [&str; 9] = [
    "version", "fence", "seq", "replica", "updated", "ws", "owner", "until", "lseq",
];

/// Those fields and Redis's clock, read in one pipeline.
pub(crate) type SessionReadout = (Vec<Option<String>>, (u64, u64));

/// Steps of the random fraction of an index score: below a millisecond.
pub(crate) const FRACTION_STEPS: u16 = 1000;

pub(crate) fn rand_fraction() -> u16 {
    rand::random_range(0..FRACTION_STEPS)
}

impl RedisStore {
    /// Connects (and reconnects on failure) to `url` (`redis://…`).
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::connect_in(url, KeySpace::default()).await
    }

    /// Connects, with every key in `space` (laid out for a cluster when
    /// the URL names one).
    pub async fn connect_in(url: &str, space: KeySpace) -> StoreResult<Self> {
        let conn = Conn::open(url).await?;
        let space = if conn.is_cluster() {
            space.clustered()
        } else {
            space
        };
        let store = Self {
            run: std::sync::Arc::new(RunView::new(space.buckets())),
            space: std::sync::Arc::new(space),
            conn,
            scripts: std::sync::Arc::new(Scripts::new()),
        };
        store.run.refresh(&store.conn).await?;
        Ok(store)
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// Another connection to the same Redis, sharing this one's scripts and
    /// its idea of the Redis run (which the heartbeat, on one connection,
    /// keeps current).
    pub async fn another_connection(&self, url: &str) -> StoreResult<Self> {
        Ok(Self {
            space: self.space.clone(),
            conn: Conn::open(url).await?,
            scripts: self.scripts.clone(),
            run: self.run.clone(),
        })
    }

    /// The positions of `items` grouped by the bucket of their session,
    /// bucket by bucket: what one pipeline or transaction may hold on a
    /// cluster (one slot). A single server has one bucket, all of them.
    pub(crate) fn group_by_bucket<T>(
        &self,
        items: &[T],
        key: impl Fn(&T) -> &SessionKey,
    ) -> Vec<(u16, Vec<usize>)> {
        if items.is_empty() {
            return Vec::new();
        }
        if !self.space.is_clustered() {
            return vec![(0, (0..items.len()).collect())];
        }
        let mut groups: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, item) in items.iter().enumerate() {
            groups
                .entry(self.space.bucket_of_key(key(item)))
                .or_default()
                .push(i);
        }
        groups.into_iter().collect()
    }

    pub(crate) async fn begin_once(
        &self,
        req: &BeginRequest,
        dead: Option<(&str, u64)>,
        on_missing: OnMissing<'_>,
    ) -> StoreResult<RawBegin> {
        let keys = self.space.session(&req.key);
        let run_hint = self.run.get(keys.bucket);
        let mut invocation = self.scripts.begin.prepare_invoke();
        invocation
            .key(&keys.state)
            .key(&keys.payload)
            .key(&keys.known)
            .arg(req.replica.as_str())
            .arg(req.turn_seq.map(|s| s.to_string()).unwrap_or_default())
            .arg(req.turn_seq.map(record_slot).unwrap_or_default())
            .arg(millis(req.lease_ttl))
            // The state must outlive the lease, whatever the settings.
            .arg(millis(req.state_ttl.max(req.lease_ttl)))
            .arg(dead.map(|(owner, _)| owner).unwrap_or_default())
            .arg(dead.map(|(_, fence)| fence.to_string()).unwrap_or_default())
            .arg(match on_missing {
                OnMissing::Create => "create",
                OnMissing::Report => "report",
                OnMissing::CreateUnknown { .. } => "create-unknown",
            })
            .arg(match on_missing {
                OnMissing::CreateUnknown { run } => run,
                _ => &*run_hint,
            })
            .arg(if req.reclaim_own_lease { "reclaim" } else { "" })
            .arg(req.turn_seq.map(digest_slot).unwrap_or_default());
        // Without a cached version the payload is fetched in the same round
        // trip; with one, only on a cache miss (a third round trip then).
        let fetch_payload = req.cached_version.is_none();
        let mut results: Vec<Value> = self
            .conn
            .with_script(&self.scripts.begin, |pipe| {
                pipe.invoke_script(&invocation);
                if fetch_payload {
                    pipe.get(&keys.payload);
                }
            })
            .await?;
        let prefetched = if fetch_payload { results.pop() } else { None };
        let reply = match results.pop() {
            Some(Value::Array(values)) => Reply(values),
            other => return Err(corrupt(format!("begin answered {other:?}"))),
        };
        let outcome = match reply.text(0)?.as_str() {
            "MISSING" => {
                let run = reply.text(1)?;
                self.run.set(keys.bucket, &run);
                return Ok(RawBegin::Missing {
                    run,
                    known: reply.int(2)? == 1,
                });
            }
            "UNVERIFIED" => {
                let run = reply.text(2)?;
                self.run.set(keys.bucket, &run);
                return Ok(RawBegin::Unverified {
                    version: reply.num(1)?,
                    run,
                });
            }
            "CORRUPT" => Err(corrupt(format!(
                "{}: field {} is not a number",
                req.key,
                reply.text(1)?
            ))),
            "GRANTED" => {
                let version = reply.num(3)?;
                let workspace = reply.text(4)?;
                let payload = match (prefetched, req.cached_version) {
                    (_, Some(cached)) if cached == version => None,
                    // A session that never committed has no payload, whatever
                    // a key left from an expired predecessor may hold.
                    _ if version == 0 => Some(Bytes::new()),
                    (Some(Value::BulkString(bytes)), _) => Some(Bytes::from(bytes)),
                    (Some(Value::Nil), _) => {
                        return Err(corrupt(format!(
                            "{}: version {version} has no payload",
                            req.key
                        )));
                    }
                    (Some(other), _) => return Err(corrupt(format!("payload is {other:?}"))),
                    (None, _) => {
                        let bytes: Option<Vec<u8>> = self
                            .conn
                            .clone()
                            .get(&keys.payload)
                            .await
                            .map_err(unavailable)?;
                        match bytes {
                            Some(bytes) => Some(Bytes::from(bytes)),
                            None => {
                                return Err(corrupt(format!(
                                    "{}: version {version} has no payload",
                                    req.key
                                )));
                            }
                        }
                    }
                };
                Ok(BeginOutcome::Granted {
                    lease: Lease {
                        key: req.key.clone(),
                        replica: req.replica.clone(),
                        fence: reply.num(1)?,
                        turn_seq: reply.num(2)?,
                        version,
                    },
                    state: SessionState {
                        version,
                        payload,
                        workspace: (!workspace.is_empty()).then_some(workspace),
                    },
                })
            }
            "DUPLICATE" => {
                let stored = reply.bytes(1)?.ok_or_else(|| corrupt("empty result"))?;
                let turn_seq = req
                    .turn_seq
                    .ok_or_else(|| corrupt("duplicate without turnSeq"))?;
                match parse_result(turn_seq, &stored)? {
                    Some(_) if reused(turn_seq, reply.bytes(3)?, req) => {
                        Ok(BeginOutcome::TurnSeqReused { turn_seq })
                    }
                    Some(result) => Ok(BeginOutcome::Duplicate(result)),
                    None => Ok(BeginOutcome::Stale {
                        last_turn_seq: reply.num(2)?,
                    }),
                }
            }
            "STALE" => Ok(BeginOutcome::Stale {
                last_turn_seq: reply.num(1)?,
            }),
            "GAP" => Ok(BeginOutcome::Gap {
                next_turn_seq: reply.num(1)?,
            }),
            "BUSY" => {
                let pttl = reply.int(2)?.max(0);
                Ok(BeginOutcome::Busy {
                    owner: reply.text(1)?,
                    retry_after: Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
                })
            }
            other => Err(corrupt(format!("begin answered {other:?}"))),
        };
        outcome.map(RawBegin::Outcome)
    }

    /// The fence of the session's lease, if one is held (expired or not:
    /// `begin.lua` judges that).
    pub(crate) async fn lease_fence(&self, key: &SessionKey) -> StoreResult<Option<u64>> {
        let (fence, owner): (Option<u64>, Option<String>) = self
            .conn
            .clone()
            .hmget(self.space.session(key).state, &["fence", "owner"])
            .await
            .map_err(unavailable)?;
        Ok(fence.filter(|_| owner.is_some()))
    }
}

impl TurnStore for RedisStore {
    async fn begin(&self, req: &BeginRequest) -> StoreResult<BeginOutcome> {
        match self.begin_with(req, OnMissing::Create).await? {
            RawBegin::Outcome(outcome) => Ok(outcome),
            RawBegin::Missing { .. } | RawBegin::Unverified { .. } => Err(corrupt(
                "begin answered as if it had a ledger to ask (Redis alone has none)",
            )),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> StoreResult<bool> {
        let keys = self.space.session(&lease.key);
        let renewed: i64 = self
            .scripts
            .renew
            .key(&keys.state)
            .key(&keys.payload)
            .arg(lease.fence.to_string())
            .arg(millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(renewed == 1)
    }

    async fn commit(&self, req: &CommitRequest) -> StoreResult<CommitOutcome> {
        match self.commit_with(req, LeaseRun::Any).await? {
            RawCommit::Outcome(outcome) => Ok(outcome),
            RawCommit::Unverified { .. } => Err(corrupt(
                "commit answered as if it had a ledger to check against (Redis alone has none)",
            )),
        }
    }

    async fn abort(&self, lease: &Lease) -> StoreResult<bool> {
        let keys = self.space.session(&lease.key);
        let released: i64 = self
            .scripts
            .abort
            .key(&keys.state)
            .arg(lease.fence.to_string())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(released == 1)
    }

    async fn claim_layout(&self, mine: u32, adopt: bool) -> StoreResult<u32> {
        RedisStore::claim_layout(self, mine, adopt).await
    }

    async fn revoke(&self, key: &SessionKey) -> StoreResult<Option<String>> {
        let keys = self.space.session(key);
        self.scripts
            .revoke
            .key(&keys.state)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)
    }

    async fn interrupt(
        &self,
        key: &SessionKey,
        turn_seq: Option<u64>,
    ) -> StoreResult<Option<LeaseView>> {
        let keys = self.space.session(key);
        let interrupted: Option<(String, String, String, String)> = self
            .scripts
            .interrupt
            .key(&keys.state)
            .arg(turn_seq.map(|n| n.to_string()).unwrap_or_default())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let Some((owner, fence, turn_seq, until)) = interrupted else {
            return Ok(None);
        };
        let num = |f: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| corrupt(format!("{key}: field {f} is {v:?}, not a number")))
        };
        Ok(Some(LeaseView {
            owner,
            fence: num("fence", &fence)?,
            turn_seq: num("lseq", &turn_seq)?,
            expires_at_ms: num("until", &until)?,
        }))
    }

    async fn check_lease(&self, lease: &Lease) -> StoreResult<LeaseCheck> {
        let keys = self.space.session(&lease.key);
        type Readout = (
            (
                Option<String>,
                Option<String>,
                Option<String>,
                Option<String>,
                Option<String>,
            ),
            (u64, u64),
        );
        let ((fence, owner, until, irq, want), now): Readout = redis::pipe()
            .hmget(&keys.state, &["fence", "owner", "until", "irq", "want"])
            .cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let mine = lease.fence.to_string();
        let now_ms = now.0 * 1000 + now.1 / 1000;
        let unexpired = until
            .and_then(|u| u.parse::<u64>().ok())
            .is_some_and(|u| u > now_ms);
        Ok(
            if owner.is_some() && fence.as_deref() == Some(&mine) && unexpired {
                if want.as_deref() == Some(&lease.turn_seq.to_string()) {
                    LeaseCheck::Followed
                } else {
                    LeaseCheck::Held
                }
            } else if irq.as_deref() == Some(&mine) {
                LeaseCheck::Interrupted
            } else {
                LeaseCheck::Lost
            },
        )
    }

    async fn heartbeat_with(
        &self,
        replica: &ReplicaId,
        said: baton_session::model::ReplicaInfo,
        ttl: Duration,
    ) -> StoreResult<()> {
        let now = baton_session::turn_record::now_ms();
        let said = serde_json::to_string(&said).map_err(|e| corrupt(e.to_string()))?;
        let mut beat = redis::pipe();
        beat.pset_ex(self.space.heartbeat(replica.as_str()), now, millis(ttl))
            .ignore()
            .pset_ex(
                self.space.heartbeat_info(replica.as_str()),
                said,
                millis(ttl),
            )
            .ignore()
            // Replicas gone for long leave the index (the listing only reads).
            .cmd("ZREMRANGEBYSCORE")
            .arg(self.space.replicas())
            .arg("-inf")
            .arg(now.saturating_sub(REPLICA_FORGET_MS))
            .ignore()
            .zadd(self.space.replicas(), replica.as_str(), now + millis(ttl))
            .ignore();
        if self.conn.is_cluster() {
            return self
                .cluster_heartbeat(&beat, replica.as_str(), now, ttl)
                .await;
        }
        // One server: all of it and the run in one round trip, so after a
        // restart the hint is current again within one heartbeat.
        let (info,): (String,) = beat
            .cmd("INFO")
            .arg("server")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        self.run.set(0, &run_id(&info)?);
        Ok(())
    }

    async fn read_state(&self, key: &SessionKey) -> StoreResult<Option<CommittedState>> {
        let keys = self.space.session(key);
        // MULTI/EXEC: the version and its payload are read with no commit
        // in between.
        let ((version, workspace), payload): (VersionAndWorkspace, Option<Vec<u8>>) = redis::pipe()
            .atomic()
            .cmd("HMGET")
            .arg(&keys.state)
            .arg("version")
            .arg("ws")
            .get(&keys.payload)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let Some(version) = version else {
            return Ok(None);
        };
        let version: u64 = version
            .parse()
            .map_err(|_| corrupt(format!("{key}: version {version:?} is not a number")))?;
        let payload = match payload {
            // A session that never committed has no payload, whatever a key
            // left by an expired predecessor (payloads outlive their state
            // by up to STAGED_TTL_MS) may hold.
            _ if version == 0 => Bytes::new(),
            Some(bytes) => Bytes::from(bytes),
            None => return Err(corrupt(format!("{key}: version {version} has no payload"))),
        };
        Ok(Some(CommittedState {
            version,
            payload,
            workspace: workspace.filter(|w| !w.is_empty()),
        }))
    }

    async fn session(&self, key: &SessionKey) -> StoreResult<Option<SessionView>> {
        let keys = self.space.session(key);
        // Not HGETALL: the hash also holds up to RESULTS_RETAINED replies.
        let (fields, now): SessionReadout = redis::pipe()
            .hmget(&keys.state, &VIEW_FIELDS)
            .cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let field = |name: &str| {
            let i = VIEW_FIELDS.iter().position(|f| *f == name)?;
            fields.get(i)?.clone()
        };
        // Every state hash has a fence from its first grant on.
        if field("fence").is_none() {
            return Ok(None);
        }
        // An absent counter is 0 (a session that never committed has no
        // version); one that is present and not a number is corrupt.
        let num = |f: &str| match field(f) {
            None => Ok(0),
            Some(v) => v
                .parse::<u64>()
                .map_err(|_| corrupt(format!("{key}: field {f} is {v:?}, not a number"))),
        };
        let now_ms = now.0 * 1000 + now.1 / 1000;
        let lease = match (field("owner"), num("until")?) {
            (Some(owner), until) if until > now_ms => Some(LeaseView {
                owner,
                fence: num("fence")?,
                turn_seq: num("lseq")?,
                expires_at_ms: until,
            }),
            _ => None,
        };
        Ok(Some(SessionView {
            key: key.clone(),
            version: num("version")?,
            fence: num("fence")?,
            last_turn_seq: num("seq")?,
            last_replica: field("replica"),
            updated_at_ms: num("updated")?,
            workspace: field("ws").filter(|w| !w.is_empty()),
            lease,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SessionKeys;
    use baton_session::durable::ShipBatch;
    use baton_session::model::TurnRecord;
    use baton_session::turn_record;

    fn record(turn_seq: u64, fence: u64) -> TurnRecord {
        TurnRecord {
            tenant: "acme".into(),
            session: "ack".into(),
            turn_seq,
            version: turn_seq,
            replica: "a".into(),
            fence,
            input_digest: "i".into(),
            reply_digest: "r".into(),
            workspace: None,
            started_at_ms: 1,
            committed_at_ms: 2,
            input: None,
            reply: None,
            interrupted: false,
        }
    }

    fn batch(key: &SessionKey, ids: &[(u64, u64)]) -> ShipBatch {
        ShipBatch {
            key: key.clone(),
            records: ids.iter().map(|&(seq, fence)| record(seq, fence)).collect(),
            durable: None,
            run: None,
        }
    }

    async fn set_log(store: &RedisStore, key: &SessionKey, ids: &[(u64, u64)]) {
        let log = SessionKeys::new(key).log;
        let mut pipe = redis::pipe();
        pipe.atomic().del(&log);
        for &(seq, fence) in ids {
            pipe.rpush(&log, serde_json::to_string(&record(seq, fence)).unwrap());
        }
        let () = pipe.query_async(&mut store.conn.clone()).await.unwrap();
    }

    async fn log(store: &RedisStore, key: &SessionKey) -> Vec<(u64, u64)> {
        let raw: Vec<String> = store
            .conn
            .clone()
            .lrange(SessionKeys::new(key).log, 0, -1)
            .await
            .unwrap();
        raw.iter()
            .map(|r| {
                let r: TurnRecord = serde_json::from_str(r).unwrap();
                (r.turn_seq, r.fence)
            })
            .collect()
    }

    /// `ack.lua` drops the records a batch names (turnSeq and fence), and no
    /// other: not one that merely has a turnSeq at or below theirs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_ack_drops_exactly_the_shipped_records() {
        let server = baton_testkit::RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let (k, other) = (
            SessionKey::new("acme", "ack").unwrap(),
            SessionKey::new("acme", "other").unwrap(),
        );
        let ack = |batches: Vec<ShipBatch>| {
            let store = store.clone();
            async move { store.ack_shipped(&batches).await.unwrap() }
        };

        set_log(&store, &k, &[(1, 10), (2, 20), (3, 30), (4, 40)]).await;
        set_log(&store, &other, &[(7, 70)]).await;
        // Two sessions in one round trip; a record appended after the read stays.
        let dropped = ack(vec![
            batch(&k, &[(1, 10), (2, 20)]),
            batch(&other, &[(7, 70)]),
        ])
        .await;
        assert_eq!(dropped, [2, 1]);
        assert_eq!(log(&store, &k).await, [(3, 30), (4, 40)]);
        assert!(log(&store, &other).await.is_empty());

        // Another shipper read more of the log, and acks after the first
        // one: what it shipped and is still there goes.
        assert_eq!(
            ack(vec![batch(&k, &[(1, 10), (2, 20), (3, 30)])]).await,
            [1]
        );
        assert_eq!(log(&store, &k).await, [(4, 40)]);

        // Redis came back with an older state and used turnSeqs again: a
        // record with a shipped turnSeq but another fence, or a lower
        // turnSeq, was not shipped and stays.
        set_log(&store, &k, &[(4, 41), (5, 50)]).await;
        assert_eq!(ack(vec![batch(&k, &[(4, 40), (5, 50)])]).await, [0]);
        set_log(&store, &k, &[(2, 21), (5, 50)]).await;
        assert_eq!(ack(vec![batch(&k, &[(4, 40), (5, 50)])]).await, [0]);
        assert_eq!(log(&store, &k).await, [(2, 21), (5, 50)]);
        // Matching stops at the first record that is not the next shipped.
        set_log(&store, &k, &[(4, 40), (5, 51), (6, 60)]).await;
        assert_eq!(
            ack(vec![batch(&k, &[(4, 40), (5, 50), (6, 60)])]).await,
            [1]
        );
        assert_eq!(log(&store, &k).await, [(5, 51), (6, 60)]);

        // An empty log or an empty batch drops nothing.
        assert_eq!(ack(vec![batch(&other, &[(7, 70)])]).await, [0]);
        assert_eq!(ack(vec![batch(&k, &[])]).await, [0]);
    }

    /// What the caller judged against the ledger was the state of one Redis
    /// run: `vouch.lua` and `restore.lua` write nothing once Redis is another
    /// run (it may have restarted older again in between), nor once the
    /// state moved on; a restored or vouched state names the run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn vouch_and_restore_hold_only_in_the_run_that_was_judged() {
        let server = baton_testkit::RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let k = SessionKey::new("acme", "judged").unwrap();
        let replica = ReplicaId::new("a").unwrap();
        store
            .heartbeat(&replica, Duration::from_secs(60))
            .await
            .unwrap();
        let this_run = store.run.get(0);
        let run_of = |store: &RedisStore| {
            let (store, k) = (store.clone(), k.clone());
            async move {
                let run: Option<String> = store
                    .conn
                    .clone()
                    .hget(SessionKeys::new(&k).state, "run")
                    .await
                    .unwrap();
                run
            }
        };
        let known = baton_session::durable::LedgerSession {
            key: k.clone(),
            last_version: 7,
            last_turn_seq: 7,
            last_fence: 70,
            last_replica: "a".into(),
            last_turn_at_ms: turn_record::now_ms(),
            turn_count: 7,
            durable: None,
        };
        let copy = baton_session::durable::DurableCopy {
            version: 7,
            payload: Bytes::from_static(b"seven"),
            workspace: None,
        };
        let restore = |replacing: Option<u64>, judged_in: &str| {
            let (store, known, copy, judged_in) = (
                store.clone(),
                known.clone(),
                copy.clone(),
                judged_in.to_owned(),
            );
            async move {
                store
                    .restore(
                        &known,
                        &copy,
                        7,
                        Duration::from_secs(60),
                        replacing,
                        &judged_in,
                    )
                    .await
                    .unwrap()
            }
        };

        // Missing, judged in another run: nothing written.
        assert!(!restore(None, "another-run").await);
        assert_eq!(run_of(&store).await, None);
        // Judged in this run: restored, and it says so.
        assert!(restore(None, &this_run).await);
        assert_eq!(run_of(&store).await.as_deref(), Some(&*this_run));
        // A state that exists is not restored over unless it is the older
        // version the caller judged.
        assert!(!restore(None, &this_run).await);
        assert!(!restore(Some(3), &this_run).await);
        assert!(!restore(Some(7), "another-run").await);
        assert!(restore(Some(7), &this_run).await);

        // Vouching: only the version and the run that were judged.
        assert!(!store.vouch(&k, 7, "another-run").await.unwrap());
        assert!(!store.vouch(&k, 6, &this_run).await.unwrap());
        assert!(store.vouch(&k, 7, &this_run).await.unwrap());
    }
}
