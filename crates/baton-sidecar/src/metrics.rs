//! Prometheus metrics of one sidecar, served at `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_views::latency;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: String,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~26 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    turns: Family<OutcomeLabel, Counter>,
    turn_seconds: Histogram,
    protocol_seconds: Family<StepLabel, Histogram>,
    pub in_flight: Gauge,
    pub leases_held: Gauge,
    /// Brought up to date from the Redis connection's own count at every
    /// scrape (the session crate knows nothing of Prometheus).
    redis_requests: Counter,
    /// Turns by latency bucket, for the admin status (the dashboard's
    /// plots): prometheus-client does not hand out its buckets.
    latency: Arc<[AtomicU64; latency::BUCKETS]>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("baton");
        let turns = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "turns",
            "Turns answered, by outcome (ok, duplicate, busy, conflict, lease_lost, ...)",
            turns.clone(),
        );
        let turn_seconds = latency_histogram();
        registry.register(
            "turn_duration_seconds",
            "Whole turns as the client sees them, agent included",
            turn_seconds.clone(),
        );
        let protocol_seconds =
            Family::<StepLabel, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        registry.register(
            "protocol_duration_seconds",
            "Store round trips of the turn protocol, by step (begin, commit, renew, abort)",
            protocol_seconds.clone(),
        );
        let in_flight = Gauge::default();
        registry.register("turns_in_flight", "Turns running now", in_flight.clone());
        let leases_held = Gauge::default();
        registry.register(
            "leases_held",
            "Session leases this replica holds now",
            leases_held.clone(),
        );
        let redis_requests = Counter::default();
        registry.register(
            "redis_requests",
            "Requests sent to Redis (a command or a pipeline each: one round trip), background work included",
            redis_requests.clone(),
        );
        Self {
            registry: Arc::new(registry),
            redis_requests,
            turns,
            turn_seconds,
            protocol_seconds,
            in_flight,
            leases_held,
            latency: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

impl Metrics {
    pub fn turn(&self, outcome: &str, took: Duration) {
        self.turns
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
        self.turn_seconds.observe(took.as_secs_f64());
        self.latency[latency::bucket(took.as_secs_f64() * 1000.0)].fetch_add(1, Ordering::Relaxed);
    }

    /// Turns answered so far, per latency bucket.
    pub fn latency_counts(&self) -> Vec<u64> {
        self.latency
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    pub fn protocol(&self, step: &str, took: Duration) {
        self.protocol_seconds
            .get_or_create(&StepLabel {
                step: step.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        {
            // One scrape at a time tops the counter up.
            static TOP_UP: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _one = TOP_UP.lock().unwrap_or_else(|e| e.into_inner());
            let sent = baton_store_redis::requests_sent();
            self.redis_requests
                .inc_by(sent.saturating_sub(self.redis_requests.get()));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
