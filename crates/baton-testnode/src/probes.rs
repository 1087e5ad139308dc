//! Probe and lifecycle-hook actions, run the way a kubelet runs them:
//! `httpGet` and `tcpSocket` from the node (the root network namespace) to
//! the pod's IP, `exec` inside the pod's network namespace with the
//! container's environment and working directory.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerPort, ExecAction, HTTPGetAction, LifecycleHandler, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::images::Runner;
use crate::runtime::launch::Launch;

/// Where and how a container's probes run.
#[derive(Clone)]
pub(crate) struct ProbeTarget {
    pub pod_ip: Ipv4Addr,
    pub netns: String,
    pub ports: Vec<ContainerPort>,
    /// The container's launch: exec actions use its env and cwd.
    pub launch: Launch,
    pub runner: Runner,
    pub http: reqwest::Client,
}

/// One probe or hook action.
pub(crate) enum Action<'a> {
    Http(&'a HTTPGetAction),
    Tcp(&'a TCPSocketAction),
    Exec(&'a ExecAction),
    Sleep(i64),
}

impl<'a> Action<'a> {
    pub fn of_probe(probe: &'a Probe) -> Option<Self> {
        if let Some(h) = &probe.http_get {
            Some(Self::Http(h))
        } else if let Some(t) = &probe.tcp_socket {
            Some(Self::Tcp(t))
        } else {
            probe.exec.as_ref().map(Self::Exec)
        }
    }

    pub fn of_handler(handler: &'a LifecycleHandler) -> Option<Self> {
        if let Some(h) = &handler.http_get {
            Some(Self::Http(h))
        } else if let Some(t) = &handler.tcp_socket {
            Some(Self::Tcp(t))
        } else if let Some(e) = &handler.exec {
            Some(Self::Exec(e))
        } else {
            handler.sleep.as_ref().map(|s| Self::Sleep(s.seconds))
        }
    }
}

/// A client for httpGet actions: no redirects followed (a 3xx is a
/// success, as for the kubelet), no proxy.
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent("kube-probe/1.34")
        .build()
        .expect("an HTTP client without TLS builds")
}

/// Runs `action` with `timeout`; `Err` carries what a kubelet would put
/// into its event.
pub(crate) async fn run(
    target: &ProbeTarget,
    action: &Action<'_>,
    timeout: Duration,
) -> Result<(), String> {
    match action {
        Action::Http(h) => http_get(target, h, timeout).await,
        Action::Tcp(t) => {
            let port = resolve_port(&t.port, &target.ports)?;
            let host = t.host.clone().unwrap_or_else(|| target.pod_ip.to_string());
            match tokio::time::timeout(
                timeout,
                tokio::net::TcpStream::connect((host.as_str(), port)),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
                Err(_) => Err(format!("dial tcp {host}:{port}: timeout")),
            }
        }
        Action::Exec(e) => exec(target, e, timeout).await,
        Action::Sleep(seconds) => {
            tokio::time::sleep(Duration::from_secs((*seconds).max(0) as u64)).await;
            Ok(())
        }
    }
}

async fn http_get(
    target: &ProbeTarget,
    h: &HTTPGetAction,
    timeout: Duration,
) -> Result<(), String> {
    let port = resolve_port(&h.port, &target.ports)?;
    let scheme = h.scheme.as_deref().unwrap_or("HTTP");
    if !scheme.eq_ignore_ascii_case("HTTP") {
        return Err(format!("scheme {scheme} is not supported by the test node"));
    }
    let host = h.host.clone().unwrap_or_else(|| target.pod_ip.to_string());
    let mut path = h.path.clone().unwrap_or_else(|| "/".into());
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    let path = rewrite_path(&target.runner, &path);
    let url = format!("http://{host}:{port}{path}");
    let mut request = target.http.get(&url).timeout(timeout);
    for header in h.http_headers.iter().flatten() {
        request = request.header(&header.name, &header.value);
    }
    match request.send().await {
        Ok(response) if (200..400).contains(&response.status().as_u16()) => Ok(()),
        Ok(response) => Err(format!(
            "HTTP probe failed with statuscode: {}",
            response.status().as_u16()
        )),
        Err(e) => Err(format!("Get {url:?}: {e}")),
    }
}

/// The one mock of this node: SeaweedFS has no MinIO health endpoints, so
/// `/minio/health/*` (live, ready, cluster) is asked of SeaweedFS's S3
/// `/healthz`, which answers 200 once its S3 gateway serves.
fn rewrite_path(runner: &Runner, path: &str) -> String {
    if *runner == Runner::SeaweedAsMinio && path.starts_with("/minio/health/") {
        "/healthz".into()
    } else {
        path.to_owned()
    }
}

async fn exec(target: &ProbeTarget, e: &ExecAction, timeout: Duration) -> Result<(), String> {
    let argv = e.command.clone().unwrap_or_default();
    let Some((program, args)) = argv.split_first() else {
        return Err("exec action without a command".into());
    };
    // Paths in the command are the container's, like the process's args.
    let mounts = &target.launch.mounts;
    let launch = Launch {
        program: mounts.translate(program),
        args: args.iter().map(|a| mounts.translate(a)).collect(),
        user: None,
        setup: None,
        ..target.launch.clone()
    };
    let mut cmd = crate::runtime::process::command(&launch, Some(&target.netns));
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    match tokio::time::timeout(timeout, cmd.output()).await {
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => Err(format!(
            "command {argv:?} exited with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(Err(err)) => Err(format!("command {argv:?}: {err}")),
        Err(_) => Err(format!("command {argv:?} timed out after {timeout:?}")),
    }
}

/// A port number, or a named port looked up among the container's ports.
fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("no container port named {name:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_ports_and_minio_paths() {
        let ports = vec![ContainerPort {
            name: Some("http".into()),
            container_port: 7070,
            ..ContainerPort::default()
        }];
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &ports),
            Ok(7070)
        );
        assert_eq!(resolve_port(&IntOrString::Int(80), &ports), Ok(80));
        assert!(resolve_port(&IntOrString::String("x".into()), &ports).is_err());
        assert_eq!(
            rewrite_path(&Runner::SeaweedAsMinio, "/minio/health/ready"),
            "/healthz"
        );
        assert_eq!(
            rewrite_path(&Runner::Redis, "/minio/health/ready"),
            "/minio/health/ready"
        );
    }
}
