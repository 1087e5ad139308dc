//! The operator's Prometheus metrics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `applied`, `unchanged`, `invalid`, `error`
    pub result: &'static str,
    /// For `error`, which: `api`, `apply`, `prune`, `watch_not_ready`,
    /// `not_leader` (empty, so absent, otherwise).
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `apply`, `delete`, `status`, `event`
    pub verb: &'static str,
}

pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<ResultLabel, Counter>,
    pub reconcile_seconds: Histogram,
    pub api_writes: Family<WriteLabel, Counter>,
    /// Every write of `api_writes`, summed (for the log line of a leader
    /// that stops).
    writes_total: AtomicU64,
    pub refused_writes: Counter,
    pub leader: Gauge<i64, AtomicI64>,
    pub watched: Family<KindLabel, Gauge<i64, AtomicI64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("baton_operator");
        let reconciles = Family::<ResultLabel, Counter>::default();
        registry.register("reconciles", "Reconciles by result", reconciles.clone());
        let reconcile_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile",
            reconcile_seconds.clone(),
        );
        let api_writes = Family::<WriteLabel, Counter>::default();
        registry.register(
            "api_writes",
            "Write requests sent to the API server, by verb",
            api_writes.clone(),
        );
        let refused_writes = Counter::default();
        registry.register(
            "refused_writes",
            "Writes not sent: this instance was no longer the leader within its renewal deadline",
            refused_writes.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this instance is the leader",
            leader.clone(),
        );
        let watched = Family::<KindLabel, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "watched_objects",
            "Objects in the watch caches, by kind",
            watched.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_seconds,
            api_writes,
            writes_total: AtomicU64::new(0),
            refused_writes,
            leader,
            watched,
        }
    }
}

impl Metrics {
    pub fn write(&self, verb: &'static str) {
        self.api_writes.get_or_create(&WriteLabel { verb }).inc();
        self.writes_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes sent since the start, every verb.
    pub fn writes(&self) -> u64 {
        self.writes_total.load(Ordering::Relaxed)
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("metrics encode");
        out
    }
}
