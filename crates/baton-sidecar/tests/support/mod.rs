//! What the sidecar crate's in-process engine tests share: the reference
//! agent on a free port and the timings they run with.

use std::time::Duration;

use baton_sidecar::engine::Timings;

/// Starts the reference agent in this process; its base URL.
pub async fn agent() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(baton_agent::serve(
        listener,
        baton_agent::AgentConfig::default(),
    ));
    url
}

/// A 30 s lease and a heartbeat that never lapses during a test.
pub fn timings() -> Timings {
    Timings {
        lease_ttl: Duration::from_secs(30),
        state_ttl: Duration::from_secs(3600),
        renew_interval: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(10),
        heartbeat_interval: Duration::from_secs(1),
        heartbeat_ttl: Duration::from_secs(60),
    }
}
