//! kube-proxy's part, in user space: a local port for one Service, where
//! each TCP connection goes to a ready endpoint of the Service's
//! EndpointSlices (which the real kube-controller-manager keeps from pod
//! readiness and termination), in turn. Like kube-proxy, it balances
//! connections, not requests: a client's kept-alive connection stays with
//! one pod until either side closes it. Like its old userspace mode, a
//! connection refused by one endpoint is tried on the next.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running proxy for one Service; stops when dropped.
pub struct ServiceProxy {
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl ServiceProxy {
    /// Proxies `127.0.0.1:<free port>` to the endpoints of
    /// `namespace/service` on the port named `port_name`.
    pub async fn start(
        client: Client,
        namespace: &str,
        service: &str,
        port_name: &str,
    ) -> anyhow::Result<Self> {
        let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
        let (store, writer) = reflector::store();
        let config =
            watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
        let watch = tokio::spawn(
            watcher(api, config)
                .default_backoff()
                .reflect(writer)
                .for_each(|_| async {}),
        );
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy's port")?;
        let addr = listener.local_addr()?;
        let port_name = port_name.to_owned();
        let next = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (store, port_name, next) = (store.clone(), port_name.clone(), next.clone());
                tokio::spawn(async move {
                    let _ = forward(inbound, &store, &port_name, &next).await;
                });
            }
        });
        Ok(Self {
            addr,
            tasks: vec![watch, accept],
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The ready endpoints, as addresses on the named port.
fn ready_endpoints(store: &Store<EndpointSlice>, port_name: &str) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for slice in store.state() {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port_name))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            // An absent `ready` means ready (the API's rule).
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in &endpoint.addresses {
                if let Ok(ip) = address.parse::<std::net::IpAddr>() {
                    out.push(SocketAddr::new(ip, port as u16));
                }
            }
        }
    }
    out.sort();
    out
}

async fn forward(
    mut inbound: TcpStream,
    store: &Store<EndpointSlice>,
    port_name: &str,
    next: &AtomicUsize,
) -> std::io::Result<()> {
    let endpoints = ready_endpoints(store, port_name);
    if endpoints.is_empty() {
        // No endpoint: the connection is refused, as with kube-proxy.
        return Ok(());
    }
    let first = next.fetch_add(1, Ordering::Relaxed);
    for i in 0..endpoints.len() {
        let target = endpoints[(first + i) % endpoints.len()];
        if let Ok(mut outbound) = TcpStream::connect(target).await {
            let _ = outbound.set_nodelay(true);
            let _ = inbound.set_nodelay(true);
            tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await?;
            return Ok(());
        }
    }
    Ok(())
}
