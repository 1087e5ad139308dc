//! The replicas' turn counts over the last minutes: a snapshot of each
//! replica's latency buckets every [`SAMPLE_EVERY`] (taken by
//! [`sample_forever`], and by any page that asks the sidecars anyway),
//! from which the replicas page plots turns/s and p50/p99 latency.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_views::latency;

use crate::model::RatePoint;
use crate::server::{Dashboard, data};

/// How far apart two samples of one replica are, at least.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept per replica: ten minutes.
pub const KEPT: usize = 120;

/// When (Unix ms), and the latency bucket counts then.
type Sample = (u64, Vec<u64>);

#[derive(Default)]
pub struct Samples {
    by_replica: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl Samples {
    /// Keeps `counts` as `holder`'s snapshot at `at_ms`, unless it has one
    /// younger than [`SAMPLE_EVERY`].
    pub fn record(&self, holder: &str, at_ms: u64, counts: Vec<u64>) {
        if counts.is_empty() {
            return;
        }
        let mut all = self.by_replica.lock().unwrap_or_else(|e| e.into_inner());
        let samples = all.entry(holder.to_owned()).or_default();
        if samples
            .back()
            .is_some_and(|(last, _)| at_ms < last + SAMPLE_EVERY.as_millis() as u64)
        {
            return;
        }
        samples.push_back((at_ms, counts));
        if samples.len() > KEPT {
            samples.pop_front();
        }
    }

    /// Forgets replicas that are gone.
    pub fn retain(&self, live: &[&str]) {
        let mut all = self.by_replica.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|holder, _| live.contains(&holder.as_str()));
    }

    /// Turns/s and latency between each two consecutive samples (none for
    /// an interval without turns).
    pub fn series(&self, holder: &str) -> Vec<RatePoint> {
        let all = self.by_replica.lock().unwrap_or_else(|e| e.into_inner());
        let Some(samples) = all.get(holder) else {
            return Vec::new();
        };
        samples
            .iter()
            .zip(samples.iter().skip(1))
            .map(|((t0, before), (t1, after))| {
                let point = latency::between(before, after, t1 - t0);
                RatePoint {
                    at_ms: *t1,
                    turns_per_s: point.map_or(0.0, |p| p.0),
                    p50_ms: point.map(|p| p.1),
                    p99_ms: point.map(|p| p.2),
                }
            })
            .collect()
    }
}

/// Samples every replica every [`SAMPLE_EVERY`] until the process ends.
pub async fn sample_forever(dashboard: Arc<Dashboard>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        if let Err(e) = data::replicas(&dashboard).await {
            tracing::debug!(error = %e, "dashboard: sampling the replicas failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_become_rates_per_interval() {
        let samples = Samples::default();
        let mut counts = vec![0; latency::BUCKETS];
        samples.record("r-1", 0, counts.clone());
        counts[3] += 50;
        samples.record("r-1", 1_000, counts.clone()); // too soon: skipped
        samples.record("r-1", 10_000, counts.clone());
        samples.record("r-1", 15_000, counts.clone());
        let series = samples.series("r-1");
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].turns_per_s, 5.0);
        assert_eq!(series[0].p99_ms, Some(latency::bound_ms(3)));
        assert_eq!((series[1].turns_per_s, series[1].p50_ms), (0.0, None));
        samples.retain(&["r-2"]);
        assert!(samples.series("r-1").is_empty());
    }
}
