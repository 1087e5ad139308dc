//! Which Redis run answers for which sessions: one server has one run (its
//! `INFO` `run_id`, new with every start); on a cluster each master has its
//! own and fails over on its own, so the run of a session is the run of the
//! master serving its bucket's slot.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use redis::Value;

use super::conn::Conn;
use super::slots::{SLOTS, slot_of_bucket};
use super::{corrupt, run_id, unavailable};
use crate::store::StoreResult;

/// This client's idea of the Redis run behind each bucket (one bucket on
/// a single server), refreshed by every heartbeat, by every script answer
/// that names the run (MISSING, UNVERIFIED, vouch, restore) and after a
/// LEASE_LOST commit in this-run mode. Only a hint, which spares every
/// begin an `INFO` (about 10 µs of Redis CPU): `begin.lua` uses it to
/// decide whether a state needs checking against the ledger, while
/// `commit.lua` asks Redis itself, so a stale hint can waste a turn, never
/// let one commit on an older state.
#[derive(Debug)]
pub(super) struct RunView(RwLock<Vec<Arc<str>>>);

impl RunView {
    pub fn new(buckets: u16) -> Self {
        Self(RwLock::new(vec![Arc::from(""); usize::from(buckets)]))
    }

    /// Read on every begin: a reference count, not a copy of the id.
    pub fn get(&self, bucket: u16) -> Arc<str> {
        let runs = self.0.read().unwrap_or_else(|p| p.into_inner());
        runs.get(usize::from(bucket))
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    pub fn set(&self, bucket: u16, run: &str) {
        let mut runs = self.0.write().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = runs.get_mut(usize::from(bucket))
            && **slot != *run
        {
            *slot = run.into();
        }
    }

    /// Every bucket at once, from `run_of_bucket`.
    pub fn set_all(&self, run_of_bucket: impl Fn(u16) -> Option<Arc<str>>) {
        let mut runs = self.0.write().unwrap_or_else(|p| p.into_inner());
        for (bucket, slot) in runs.iter_mut().enumerate() {
            if let Some(run) = u16::try_from(bucket).ok().and_then(&run_of_bucket) {
                *slot = run;
            }
        }
    }
}

/// The masters of a cluster: the slot ranges each serves and its run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Topology {
    /// (first slot, last slot, master address `host:port`).
    ranges: Vec<(u16, u16, String)>,
    /// Master address → its run id.
    runs: HashMap<String, Arc<str>>,
}

impl Topology {
    /// The master serving `slot`, if any does.
    pub fn master_of(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(first, last, _)| *first <= slot && slot <= *last)
            .map(|(_, _, addr)| addr.as_str())
    }

    pub fn run_of_bucket(&self, bucket: u16) -> Option<Arc<str>> {
        self.runs
            .get(self.master_of(slot_of_bucket(bucket))?)
            .cloned()
    }
}

/// Reads the cluster's slot map (`CLUSTER SLOTS`: every Redis since 3.0
/// and the managed ones answer it) and every master's run (`INFO server`,
/// which the cluster client sends to all masters), in two round trips.
pub(super) async fn read_topology(conn: &Conn) -> StoreResult<Topology> {
    let mut conn = conn.clone();
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    let infos: Value = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(unavailable)?;
    let mut topology = Topology {
        ranges: parse_slots(&slots)?,
        ..Topology::default()
    };
    let Value::Map(infos) = infos else {
        return Err(corrupt(format!("INFO on a cluster answered {infos:?}")));
    };
    for (addr, info) in &infos {
        // A master that failed to answer is left out: its buckets keep
        // their last hint until the next refresh.
        let (Ok(addr), Ok(info)) = (
            redis::from_redis_value_ref::<String>(addr),
            redis::from_redis_value_ref::<String>(info),
        ) else {
            continue;
        };
        if let Ok(run) = run_id(&info) {
            topology.runs.insert(addr, run.into());
        }
    }
    Ok(topology)
}

/// `CLUSTER SLOTS`: `[[first, last, [host, port, id, ...], replicas...], ...]`.
fn parse_slots(value: &Value) -> StoreResult<Vec<(u16, u16, String)>> {
    let bad = || corrupt(format!("CLUSTER SLOTS answered {value:?}"));
    let Value::Array(entries) = value else {
        return Err(bad());
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err(bad());
        };
        let number = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => u16::try_from(*n).ok().filter(|n| *n < SLOTS),
            _ => None,
        };
        let (Some(first), Some(last)) = (number(fields.first()), number(fields.get(1))) else {
            return Err(bad());
        };
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err(bad());
        };
        let host: String = master
            .first()
            .and_then(|h| redis::from_redis_value_ref(h).ok())
            .ok_or_else(bad)?;
        let port = match master.get(1) {
            Some(Value::Int(p)) => *p,
            _ => return Err(bad()),
        };
        ranges.push((first, last, format!("{host}:{port}")));
    }
    Ok(ranges)
}
