//! The sidecar's runtime threads: N single-threaded runtimes sharing one
//! listener (`--worker-threads`, default one).
//!
//! A sidecar mostly waits on the network. On one thread its turns batch
//! well and cost little CPU, but under load one thread is also one queue:
//! a sidecar with more than one core to itself needs more threads, and a
//! work-stealing pool of two cost 10-15% more CPU per turn than two
//! current-thread runtimes (BENCHMARKS.md). So each thread runs its own
//! runtime with its own Redis connection, agent client and workspace store
//! (see [`crate::engine::Engine::sibling`]), and a task on the first
//! thread accepts every connection and hands them out in turn. A
//! connection stays on the thread it was given for its whole life, so a
//! turn's HTTP, Redis and agent I/O never cross threads. What does: the
//! Postgres pool (shared; rare on the turn path) and the first thread's
//! heartbeat and ledger shipper. The first thread also serves its share.
//!
//! Connections, not requests, are spread: a client with one keep-alive
//! connection (a proxy in front, say) is served by one thread.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

use crate::http::{self, Api, ApiStore};

/// How many runtime threads to run: `0` means one per core (the cgroup's
/// CPU quota counts, so a pod limited to one CPU gets one).
pub fn count(requested: usize) -> usize {
    match requested {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// An accepted connection and its peer's address, on its way to a thread.
type Handed = (std::net::TcpStream, SocketAddr);

/// Where [`hand_out`] sends a runtime thread its connections.
pub type LaneSender = mpsc::UnboundedSender<Handed>;

/// A runtime thread's share of the listener's connections, as a listener.
pub struct Lane {
    connections: mpsc::UnboundedReceiver<Handed>,
    addr: SocketAddr,
}

pub fn lane(addr: SocketAddr) -> (LaneSender, Lane) {
    let (sender, connections) = mpsc::unbounded_channel();
    (sender, Lane { connections, addr })
}

impl axum::serve::Listener for Lane {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let Some((connection, peer)) = self.connections.recv().await else {
                // `hand_out` is gone: the process is stopping.
                return std::future::pending().await;
            };
            // Registers the socket with this thread's reactor.
            match TcpStream::from_std(connection) {
                Ok(mut connection) => {
                    baton_serve::set_no_delay(&mut connection);
                    return (connection, peer);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dropping a connection this thread could not take")
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// Accepts every connection and hands them to the lanes in turn, until
/// `stop` turns true; then the listener closes, so new clients are refused
/// rather than accepted and dropped.
pub async fn hand_out(
    mut listener: TcpListener,
    lanes: Vec<LaneSender>,
    mut stop: watch::Receiver<bool>,
) {
    for (n, lane) in lanes.iter().enumerate().cycle() {
        // axum's accept retries and logs the errors a listener can hit
        // (a reset connection, too many open files).
        let (connection, peer) = tokio::select! {
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let connection = match connection.into_std() {
            Ok(connection) => connection,
            Err(e) => {
                tracing::warn!(error = %e, "dropping a connection that could not be handed out");
                continue;
            }
        };
        if lane.send((connection, peer)).is_err() && !*stop.borrow() {
            // A runtime thread ended while the replica serves: its share of
            // the connections would now be dropped unanswered. Crash, so
            // the replica restarts whole (its leases are freed three
            // heartbeats later, as after any crash).
            tracing::error!(thread = n, "a runtime thread is gone; exiting");
            std::process::exit(1);
        }
    }
}

/// Serves one lane until `stop` turns true; then the server closes its
/// connections as their requests finish.
pub async fn serve<S: ApiStore>(
    lane: Lane,
    api: Arc<Api<S>>,
    routes: http::Routes,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    baton_serve::serve(
        lane,
        http::router(api, routes),
        baton_serve::Limits::DEFAULT,
        async move {
            // An error means the sender is gone, which also means stop.
            let _ = stop.wait_for(|stop| *stop).await;
        },
    )
    .await;
    Ok(())
}

/// Starts a runtime thread called `name`: `setup` runs on it first
/// (connecting its stores) and gives the future the thread then runs until
/// it ends. Returns once setup is done, with a future that waits for the
/// thread.
pub async fn start<Setup, Ready, Run>(
    name: String,
    setup: Setup,
) -> anyhow::Result<impl Future<Output = anyhow::Result<()>>>
where
    Setup: FnOnce() -> Ready + Send + 'static,
    Ready: Future<Output = anyhow::Result<Run>>,
    Run: Future<Output = anyhow::Result<()>>,
{
    let (ready_tx, ready_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new().name(name).spawn(move || {
        let result = runtime.block_on(async move {
            let run = match setup().await {
                Ok(run) => {
                    let _ = ready_tx.send(Ok(()));
                    run
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
            };
            run.await
        });
        let _ = done_tx.send(result);
    })?;
    ready_rx
        .await
        .context("the runtime thread ended during setup")??;
    Ok(async move {
        done_rx
            .await
            .context("the runtime thread ended without a result")?
    })
}
