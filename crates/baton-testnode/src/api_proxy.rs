//! Pods' way to the API server: a TCP relay on the node's bridge address
//! (which every pod reaches) to the API server on the machine's loopback
//! (which pods cannot reach). TLS passes through untouched: the server's
//! certificate names `kubernetes.default.svc`, the name pods use.

use std::net::{Ipv4Addr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};

/// Listens on `bind`:0 and relays every connection to `upstream`; returns
/// the port and the task (aborted when the node stops).
pub(crate) async fn start(
    bind: Ipv4Addr,
    upstream: SocketAddr,
) -> std::io::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind((bind, 0)).await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        loop {
            let (mut downstream, peer) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off, then retry.
                    tracing::debug!("API relay accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            tokio::spawn(async move {
                match TcpStream::connect(upstream).await {
                    Ok(mut up) => {
                        let _ = tokio::io::copy_bidirectional(&mut downstream, &mut up).await;
                    }
                    Err(e) => tracing::warn!(%peer, %upstream, "API relay: {e}"),
                }
            });
        }
    });
    Ok((port, task))
}

/// The names of the API server's Service, as pods' hosts files give them.
pub(crate) const NAMES: &str =
    "kubernetes kubernetes.default kubernetes.default.svc kubernetes.default.svc.cluster.local";

/// The host name containers are given in `KUBERNETES_SERVICE_HOST`: a
/// kubelet gives the Service's cluster IP, which does not exist here.
pub(crate) const HOST: &str = "kubernetes.default.svc";
