//! Baton's Redis Cluster client: one connection per master, the slot map,
//! and every request routed by the slot of its keys.
//!
//! Why not redis-rs's cluster client. Every request Baton sends names keys
//! of one slot (`slots.rs`), so routing is a table lookup; what a cluster
//! client must do besides is follow MOVED and ASK while slots move, wait
//! out a failover (TRYAGAIN, CLUSTERDOWN, a master that refuses
//! connections) and learn the slot map again. redis-rs 1.8.2 (and 2.0.0-rc.2)
//! does all of that on one task behind one `tokio::sync::RwLock`: while it
//! re-reads the slot map it polls no request, so a request queued on that
//! lock keeps the permits the lock hands it and the re-read waits for them
//! forever (after a master was SIGKILLed under load, 1 run in 20 of
//! `tests/cluster.rs`; every command to every master then hung), and even
//! when it completes, every master's requests wait for it. Here no lock is
//! held across a network wait, and a request waits only for its own
//! master: a master that is down or slow holds up its own sessions, never
//! another master's.
//!
//! What a request that meets a moving or failing slot does:
//! - MOVED: the slot is served elsewhere now: the map learns it, re-reads
//!   itself in the background, and the request goes there at once.
//! - ASK: the slot is migrating and this key already left: the request goes
//!   to the target once, after ASKING, on a connection of its own (so no
//!   other request inherits the ASKING flag).
//! - TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, LOADING, or no connection
//!   to the master: nothing ran; the map is re-read and the request tried
//!   again, backing off, for up to [`RETRY_BUDGET`].
//! - The connection failed or timed out after the request was sent: it may
//!   have run, so it is not sent again (the turn protocol decides, by its
//!   fences and idempotency keys, what a retried turn finds); the error
//!   goes to the caller and the map is re-read in the background.
//!
//! Redirections resend a whole pipeline only when all of it was refused.
//! Baton's pipelines address one slot, so a MOVED refuses all of their
//! commands at once; but while a slot migrates, an ASK (or a TRYAGAIN)
//! refuses only the commands whose keys already left, and the others ran:
//! such a pipeline goes back to the caller as failed-after-sending. After
//! an ASK a plain pipeline goes with ASKING before each command (Redis
//! keeps the flag for one command only), a transaction with one before
//! MULTI.
//!
//! # When this crate can go
//!
//! It works around a fault of redis-rs's async cluster client, not a need
//! of Baton's: the client holds a lock across network waits while it
//! recovers, so one bad node stalls the requests to every node. Upstream
//! reports of it: <https://github.com/redis-rs/redis-rs/issues/2092> ("a
//! bad node can block the world", a lock held across `refresh_connection`)
//! and <https://github.com/redis-rs/redis-rs/issues/1953> (a cluster
//! connection that sometimes never completes). Once a redis-rs release
//! has the fix, try it: replace [`Cluster`] in `baton-store-redis`'s
//! `conn.rs` with `redis::cluster_async::ClusterConnection` and run
//! `baton-ledger`'s `tests/cluster.rs` (the kill-a-master-under-load case)
//! twenty times; if every run passes, this crate can be deleted.
#![forbid(unsafe_code)]

mod cluster;
mod requests;
pub mod slots;

pub use cluster::{Cluster, SlotMap};
pub use requests::{count_request, requests_sent};
