//! Serves an axum [`Router`] the way every Baton listener must be served
//! (the sidecar, `baton dev`'s front door, the dashboard, the operator's
//! metrics, the reference agent): `axum::serve` sets no header read
//! timeout and takes connections without bound, so a client sending one
//! header byte every few seconds, or a few thousand idle connections,
//! held a listener's resources for as long as it liked.
//!
//! - **Header read timeout** ([`Limits::header_read_timeout`]): a request
//!   whose headers are not all in by then closes its connection. hyper
//!   applies it from the first byte of each request, and to the wait for
//!   the next request on a kept-alive connection, so an idle connection is
//!   closed too.
//! - **Connection cap** ([`Limits::max_connections`]): beyond it, no more
//!   connections are accepted until one closes; new clients wait in the
//!   kernel's backlog instead of taking memory here.
//! - **Client address**: every request carries
//!   `axum::extract::ConnectInfo<L::Addr>` in its extensions.
//! - **Graceful shutdown**: when `shutdown` completes, the listener closes,
//!   and each connection closes once its request in flight is answered.
//!
//! Body read limits are per route (a turn's body is read with
//! a deadline once its caller is known): see the callers.
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tower::ServiceExt as _;

/// What one listener allows its clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest a client may take to send a request's headers, and longest
    /// a kept-alive connection may wait for its next request.
    pub header_read_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: usize,
}

impl Limits {
    /// For Baton's listeners: 10 s to send headers (a client on the
    /// slowest network sends a few hundred bytes in far less), and 1,024
    /// connections (a sidecar behind a Service sees one or a few per
    /// client proxy; the dashboard one per open page).
    pub const DEFAULT: Self = Self {
        header_read_timeout: Duration::from_secs(10),
        max_connections: 1024,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How long a client should keep an idle connection to a Baton listener
/// for reuse: well under [`Limits::header_read_timeout`], after which the
/// server closes it, so a client never sends a request into a connection
/// the server is closing at that moment (the request would fail as if the
/// server had died during it).
pub const CLIENT_POOL_IDLE: Duration = Duration::from_secs(5);

/// How long a request's body may take to arrive, once its headers are in:
/// the callers that read a body give it this long.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A listener whose connections send at once. An answer is often several
/// small writes with a pause between them (a streamed turn's events, a
/// page streamed in parts): Nagle's algorithm would hold each one back
/// until the client's delayed ACK, 40 ms on Linux. A streamed turn's first
/// word came 44 ms after the agent's without it (BENCHMARKS.md).
pub fn no_delay(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt as _;
    // A named type (not `impl Listener`): axum gives a tapped listener's
    // connections their client address (`ConnectInfo<SocketAddr>`).
    listener.tap_io(set_no_delay as fn(&mut tokio::net::TcpStream))
}

/// Turns Nagle's algorithm off on one connection (see [`no_delay`]).
pub fn set_no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY");
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown`
/// completes; then stops accepting and returns once every connection
/// closed (each after its request in flight is answered).
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) where
    L: Listener,
    L::Addr: Clone + Send + Sync + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed; if it were, stop serving.
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let router = router.clone();
        let service =
            hyper::service::service_fn(move |mut request: axum::http::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(addr.clone()));
                let request = request.map(axum::body::Body::new);
                let router = router.clone();
                async move {
                    Ok::<_, Infallible>(
                        router
                            .oneshot(request)
                            .await
                            .unwrap_or_else(|never| match never {}),
                    )
                }
            });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
