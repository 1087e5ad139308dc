//! Calls to the replicas' sidecars, at the URL each advertises with its
//! heartbeat: their status (in-flight turns), drain and takeover, with the
//! admin token the sidecars were given. Every failure is a sentence naming
//! the replica and what went wrong.
//!
//! A heartbeat is data in the stores, and anyone who can write there can
//! advertise any URL: the dashboard calls a sidecar (and sends its admin
//! token) only at an address it can vouch for ([`Vouch`]): in `baton dev`
//! its own replicas; on Kubernetes the admin ports of its deployment's pods
//! (the endpoints of its headless Service, from the API); or the networks
//! it was told its sidecars are in.

use std::time::Duration;

use baton_admin_client::{AdminClient, AdminError, Target};
use baton_views::{Interrupted, ReplicaStatus, ReplicaView, Takeover};

/// How long a sidecar gets to answer a page's question.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// Takeover and drain answer at once (drain does not wait here); a
/// replica that takes longer is likely stuck, and the next one is tried.
const ACTION_TIMEOUT: Duration = Duration::from_secs(3);

/// Which advertised addresses the dashboard calls.
#[derive(Clone)]
pub enum Vouch {
    /// Exactly these base URLs, as their owner knows them now (`baton
    /// dev`: its replicas).
    Urls(std::sync::Arc<dyn Fn() -> Vec<String> + Send + Sync>),
    /// URLs whose host is an IP address in one of these networks
    /// (`baton dashboard --sidecar-networks`); none: no sidecar is called.
    Networks(Vec<ipnet::IpNet>),
    /// URLs whose address and port are one of these, as their source knows
    /// them now (`baton dashboard --kubernetes`: the admin endpoints of the
    /// deployment's headless Service).
    Endpoints(std::sync::Arc<dyn Fn() -> Vec<std::net::SocketAddr> + Send + Sync>),
}

/// The IP address a URL names as its host (never a name: a name could
/// resolve anywhere), and its port, when it is a plain `http(s)` URL with
/// no user in it.
fn address_of(url: &str) -> Option<(std::net::IpAddr, Option<u16>)> {
    let parsed = reqwest::Url::parse(url).ok()?;
    if !matches!(parsed.scheme(), "http" | "https") || !parsed.username().is_empty() {
        return None;
    }
    let host = parsed
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .ok()?;
    Some((host, parsed.port_or_known_default()))
}

impl Vouch {
    /// Parses `--sidecar-networks`: CIDRs (`10.0.0.0/8`) or addresses,
    /// separated by commas; each problem names its entry.
    pub fn networks(spec: &str) -> Result<Self, String> {
        let mut networks = Vec::new();
        for (i, entry) in spec.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let network = entry
                .parse::<ipnet::IpNet>()
                .or_else(|_| entry.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    format!(
                        "BATON_DASHBOARD_SIDECAR_NETWORKS entry {i}: {entry:?} is not a network (10.0.0.0/8) or an address"
                    )
                })?;
            networks.push(network);
        }
        Ok(Self::Networks(networks))
    }

    /// Which addresses it vouches for, in words for a refusal.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Urls(_) => "not one of baton dev's replicas",
            Self::Networks(_) => "not in baton dashboard --sidecar-networks",
            Self::Endpoints(_) => "not the admin port of one of its deployment's pods",
        }
    }

    /// Whether the dashboard may call `url`.
    pub fn vouches(&self, url: &str) -> bool {
        match self {
            Self::Urls(urls) => {
                let url = url.trim_end_matches('/');
                urls()
                    .iter()
                    .any(|known| known.trim_end_matches('/') == url)
            }
            Self::Networks(networks) => {
                address_of(url).is_some_and(|(host, _)| networks.iter().any(|n| n.contains(&host)))
            }
            Self::Endpoints(endpoints) => address_of(url).is_some_and(|(host, port)| {
                endpoints()
                    .iter()
                    .any(|e| e.ip() == host && Some(e.port()) == port)
            }),
        }
    }
}

/// Why a sidecar was not called, or what its call came to; the sentence
/// names the replica.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("{replica} does not advertise its address (its sidecar needs --advertise-url)")]
    NoAddress { replica: String },
    #[error(
        "{replica} advertises {url}, an address this dashboard cannot vouch for ({why}); not called"
    )]
    NotVouched {
        replica: String,
        url: String,
        why: &'static str,
    },
    #[error("{replica} did not answer: {error}")]
    NoAnswer { replica: String, error: AdminError },
    #[error("{replica} {error}")]
    Answered { replica: String, error: AdminError },
}

/// The sidecars' admin API as the dashboard calls it: only at vouched
/// addresses, with the admin token, naming the viewer.
#[derive(Clone)]
pub struct Sidecars {
    client: AdminClient,
    admin_token: Option<String>,
    vouch: Vouch,
}

impl Sidecars {
    pub fn new(admin_token: Option<String>, vouch: Vouch) -> Self {
        Self {
            client: AdminClient::new(baton_serve::CLIENT_POOL_IDLE),
            admin_token: admin_token.filter(|t| !t.is_empty()),
            vouch,
        }
    }

    /// The call's target at `replica`'s advertised URL, if the dashboard
    /// may call it.
    fn target<'a>(
        &'a self,
        replica: &'a ReplicaView,
        timeout: Duration,
        actor: Option<&'a str>,
    ) -> Result<Target<'a>, SidecarError> {
        let name = &replica.info.replica;
        let Some(base) = replica.info.url.as_deref() else {
            return Err(SidecarError::NoAddress {
                replica: name.clone(),
            });
        };
        if !self.vouch.vouches(base) {
            tracing::warn!(replica = %name, url = %base, "not calling a sidecar at an address the dashboard cannot vouch for");
            return Err(SidecarError::NotVouched {
                replica: name.clone(),
                url: base.to_owned(),
                why: self.vouch.describe(),
            });
        }
        Ok(Target {
            base,
            token: self.admin_token.as_deref(),
            actor,
            timeout,
        })
    }

    pub async fn status(&self, replica: &ReplicaView) -> Result<ReplicaStatus, SidecarError> {
        let target = self.target(replica, STATUS_TIMEOUT, None)?;
        let answer = self.client.status(target).await;
        answer.map_err(|e| named(replica, e))
    }

    /// Starts draining (the sidecar answers at once; the page follows it).
    pub async fn drain(
        &self,
        replica: &ReplicaView,
        actor: &str,
    ) -> Result<ReplicaStatus, SidecarError> {
        // The sidecar logs whom a drain or takeover was for.
        let actor = format!("{actor} (dashboard)");
        let target = self.target(replica, ACTION_TIMEOUT, Some(&actor))?;
        let answer = self.client.drain(target, false).await;
        answer.map_err(|e| named(replica, e))
    }

    pub async fn takeover(
        &self,
        via: &ReplicaView,
        tenant: &str,
        session: &str,
        actor: &str,
    ) -> Result<Takeover, SidecarError> {
        let actor = format!("{actor} (dashboard)");
        let target = self.target(via, ACTION_TIMEOUT, Some(&actor))?;
        let answer = self.client.takeover(target, tenant, session).await;
        answer.map_err(|e| named(via, e))
    }

    /// Stops turn `turn_seq` of the session; `Ok(None)` when it was not
    /// running (it had ended, or another turn runs now).
    pub async fn interrupt(
        &self,
        via: &ReplicaView,
        tenant: &str,
        session: &str,
        turn_seq: u64,
        actor: &str,
    ) -> Result<Option<Interrupted>, SidecarError> {
        let actor = format!("{actor} (dashboard)");
        let target = self.target(via, ACTION_TIMEOUT, Some(&actor))?;
        match self
            .client
            .interrupt(target, tenant, session, Some(turn_seq))
            .await
        {
            Ok(stopped) => Ok(Some(stopped)),
            Err(AdminError::Refused { status: 404, .. }) => Ok(None),
            Err(e) => Err(named(via, e)),
        }
    }
}

fn named(replica: &ReplicaView, error: AdminError) -> SidecarError {
    let replica = replica.info.replica.clone();
    match error {
        AdminError::TimedOut | AdminError::Unreachable | AdminError::Failed => {
            SidecarError::NoAnswer { replica, error }
        }
        error => SidecarError::Answered { replica, error },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_vouched_addresses_are_called() {
        let nets = Vouch::networks("10.244.0.0/16, 127.0.0.1").unwrap();
        assert!(nets.vouches("http://10.244.3.7:7070"));
        assert!(nets.vouches("http://127.0.0.1:7070/"));
        for other in [
            "http://127.0.0.2:7070",
            "http://10.245.0.1:7070",
            "http://evil.example:7070",
            "http://localhost:7070",
            "http://user@10.244.3.7:7070",
            "file:///etc/passwd",
            "not a url",
        ] {
            assert!(!nets.vouches(other), "{other}");
        }
        assert!(
            !Vouch::networks("")
                .unwrap()
                .vouches("http://127.0.0.1:7070")
        );
        let e = Vouch::networks("10.0.0.0/8,ten").err().unwrap();
        assert!(e.contains("entry 1"), "{e}");
        let urls = Vouch::Urls(std::sync::Arc::new(|| vec!["http://127.0.0.1:4000".into()]));
        assert!(urls.vouches("http://127.0.0.1:4000/"));
        assert!(!urls.vouches("http://127.0.0.1:18999"));
        let endpoints = Vouch::Endpoints(std::sync::Arc::new(|| {
            vec![
                "10.244.3.7:7071".parse().unwrap(),
                "[fd00::7]:7071".parse().unwrap(),
            ]
        }));
        assert!(endpoints.vouches("http://10.244.3.7:7071"));
        assert!(endpoints.vouches("http://[fd00::7]:7071/"));
        for other in [
            "http://10.244.3.7:7070",
            "http://10.244.3.8:7071",
            "http://10.244.3.7",
            "http://user@10.244.3.7:7071",
            "ftp://10.244.3.7:7071",
        ] {
            assert!(!endpoints.vouches(other), "{other}");
        }
    }
}
