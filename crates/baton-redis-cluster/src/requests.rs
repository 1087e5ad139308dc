//! Requests this process sent to Redis: a command or a pipeline each, one
//! round trip (a cluster's redirections add hidden ones). For the sidecar's
//! metrics and the benchmarks' round trips per turn; the single-server
//! connection of `baton-store-redis` counts into the same total.

use std::sync::atomic::{AtomicU64, Ordering};

static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// Requests sent to Redis so far, by every connection of this process.
pub fn requests_sent() -> u64 {
    REQUESTS.load(Ordering::Relaxed)
}

/// One more request sent (a cluster counts each node it sends to).
pub fn count_request() {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
}
