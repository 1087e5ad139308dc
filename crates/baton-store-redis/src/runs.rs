//! Which Redis run answers for which sessions: one server has one run (its
//! `INFO` `run_id`, new with every start); on a cluster each master has its
//! own and fails over on its own, so the run of a session is the run of the
//! master serving its bucket's slot.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::conn::Conn;
use crate::errors::{corrupt, unavailable};
use baton_redis_cluster::SlotMap;
use baton_redis_cluster::slots::slot_of_bucket;
use baton_session::store::StoreResult;

/// This client's idea of the Redis run behind each bucket (one bucket on
/// a single server), refreshed by every heartbeat, by every script answer
/// that names the run (MISSING, UNVERIFIED, vouch, restore) and after a
/// LEASE_LOST commit in this-run mode. Only a hint, which spares every
/// begin an `INFO` (about 10 µs of Redis CPU): `begin.lua` uses it to
/// decide whether a state needs checking against the ledger, while
/// `commit.lua` asks Redis itself, so a stale hint can waste a turn, never
/// let one commit on an older state.
///
/// On a cluster it also keeps each bucket's *home*: the first bucket its
/// master serves, where replicas keep a copy of their heartbeat for that
/// master (see `RedisStore::is_alive`).
#[derive(Debug)]
pub(super) struct RunView {
    runs: RwLock<Vec<Arc<str>>>,
    homes: RwLock<Vec<u16>>,
}

impl RunView {
    pub fn new(buckets: u16) -> Self {
        Self {
            runs: RwLock::new(vec![Arc::from(""); usize::from(buckets)]),
            homes: RwLock::new((0..buckets).collect()),
        }
    }

    /// Read on every begin: a reference count, not a copy of the id.
    pub fn get(&self, bucket: u16) -> Arc<str> {
        let runs = self.runs.read().unwrap_or_else(|p| p.into_inner());
        runs.get(usize::from(bucket))
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    pub fn set(&self, bucket: u16, run: &str) {
        let mut runs = self.runs.write().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = runs.get_mut(usize::from(bucket))
            && **slot != *run
        {
            *slot = run.into();
        }
    }

    /// Every bucket's run and home, from a cluster's topology.
    pub fn set_topology(&self, topology: &Topology) {
        let buckets = self.homes.read().unwrap_or_else(|p| p.into_inner()).len();
        let homes = topology.homes(buckets);
        let mut runs = self.runs.write().unwrap_or_else(|p| p.into_inner());
        for (bucket, slot) in runs.iter_mut().enumerate() {
            if let Some(run) = u16::try_from(bucket)
                .ok()
                .and_then(|b| topology.run_of_bucket(b))
            {
                *slot = run;
            }
        }
        drop(runs);
        *self.homes.write().unwrap_or_else(|p| p.into_inner()) = homes;
    }

    /// The home bucket of `bucket`'s master.
    pub fn home(&self, bucket: u16) -> u16 {
        let homes = self.homes.read().unwrap_or_else(|p| p.into_inner());
        homes.get(usize::from(bucket)).copied().unwrap_or(bucket)
    }

    /// Every master's home bucket.
    pub fn homes(&self) -> Vec<u16> {
        let mut homes = self.homes.read().unwrap_or_else(|p| p.into_inner()).clone();
        homes.sort_unstable();
        homes.dedup();
        homes
    }
}

/// The masters of a cluster: the slots each serves and its run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Topology {
    slots: Arc<SlotMap>,
    /// Master address → its run id.
    runs: HashMap<Arc<str>, Arc<str>>,
}

impl Topology {
    /// The master serving `slot`, if any does.
    pub fn master_of(&self, slot: u16) -> Option<&str> {
        self.slots.master_of(slot).map(|m| &**m)
    }

    pub fn run_of_bucket(&self, bucket: u16) -> Option<Arc<str>> {
        self.runs
            .get(self.master_of(slot_of_bucket(bucket))?)
            .cloned()
    }

    /// For each of `buckets` buckets, the first bucket served by the same
    /// master (itself when no master serves it).
    fn homes(&self, buckets: usize) -> Vec<u16> {
        let mut first_of: HashMap<&str, u16> = HashMap::new();
        (0..buckets)
            .map(|b| {
                let bucket = u16::try_from(b).unwrap_or_default();
                match self.master_of(slot_of_bucket(bucket)) {
                    Some(master) => *first_of.entry(master).or_insert(bucket),
                    None => bucket,
                }
            })
            .collect()
    }
}

/// Reads the cluster's slot map again (`CLUSTER SLOTS`: every Redis since
/// 3.0 and the managed ones answer it) and every master's run (`INFO
/// server`, all masters at once).
pub(super) async fn read_topology(conn: &Conn) -> StoreResult<Topology> {
    let Conn::Cluster(cluster) = conn else {
        return Err(corrupt("a cluster topology asked of a single server"));
    };
    let mut topology = Topology {
        slots: cluster.refresh().await.map_err(unavailable)?,
        ..Topology::default()
    };
    for (addr, text) in info_of_every_master(conn, &topology, "server").await {
        if let Ok(run) = run_id(&text) {
            topology.runs.insert(addr, run.into());
        }
    }
    Ok(topology)
}

/// `INFO <section>` of every master `topology` names, by address, each
/// with a deadline of its own: a master that is down (its replica not yet
/// in charge) is left out, and holds up neither the others nor the client
/// (a fan-out to every master would wait for the slowest).
pub(super) async fn info_of_every_master(
    conn: &Conn,
    topology: &Topology,
    section: &str,
) -> Vec<(Arc<str>, String)> {
    let Conn::Cluster(cluster) = conn else {
        return Vec::new();
    };
    let mut info = redis::cmd("INFO");
    info.arg(section);
    let info = &info;
    let reads = topology.slots.masters().iter().map(|addr| async move {
        let answer = tokio::time::timeout(MASTER_DEADLINE, cluster.on_node(addr, info)).await;
        (addr.clone(), answer)
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .filter_map(|(addr, answer)| {
            let value = answer.ok()?.ok()?;
            Some((addr, redis::from_redis_value_ref::<String>(&value).ok()?))
        })
        .collect()
}

/// How long one master gets to say its run.
const MASTER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

/// The `run_id` in an `INFO server` answer.
pub(crate) fn run_id(info: &str) -> StoreResult<String> {
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|r| r.trim().to_owned())
        .ok_or_else(|| corrupt("INFO server has no run_id"))
}

impl RunView {
    /// Asks Redis which run it is; on a cluster, every master.
    pub(crate) async fn refresh(&self, conn: &Conn) -> StoreResult<()> {
        if conn.is_cluster() {
            let topology = read_topology(conn).await?;
            self.set_topology(&topology);
            return Ok(());
        }
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn.clone())
            .await
            .map_err(unavailable)?;
        self.set(0, &run_id(&info)?);
        Ok(())
    }

    /// A script that vouched for a state answers with this run's id (it
    /// asked Redis); nil when it did not.
    pub(crate) fn learn(&self, bucket: u16, answer: Option<String>) -> bool {
        match answer {
            Some(run) => {
                self.set(bucket, &run);
                true
            }
            None => false,
        }
    }
}
