//! The connection to Redis: one server, or a Redis Cluster.
//!
//! `redis://host:port/db` (and `unix://`) is one server, through a
//! reconnecting [`ConnectionManager`]. `redis+cluster://host1:port1,host2:
//! port2/` names a cluster by seed nodes (any reachable one will do; the
//! client learns the rest), through Baton's cluster client (`baton-redis-cluster`),
//! which routes every command and pipeline by its keys' slot and follows
//! MOVED and ASK redirections while slots move. Both are one [`Conn`], so
//! the protocol code sends the same commands either way; what differs on a
//! cluster is which keys a pipeline may hold (one slot each: see
//! `baton_redis_cluster::slots`).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, IntoConnectionInfo as _, Pipeline, RedisFuture, Value};

use baton_redis_cluster::Cluster;

use baton_session::store::{StoreError, StoreResult};

/// The scheme of a cluster URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// A parsed `--redis-url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis://`, `unix://`), the URL as given.
    Single(String),
    /// A Redis Cluster: a `redis://` URL per seed node, each with the
    /// URL's user and password.
    Cluster { seeds: Vec<String> },
}

impl RedisTarget {
    /// Reads a Redis URL. A cluster URL's seeds are `host:port` pairs
    /// separated by commas; it takes no database number (a cluster has
    /// only database 0).
    pub fn parse(url: &str) -> StoreResult<Self> {
        let bad =
            |rule: &str| StoreError::Unavailable(format!("redis url {}: {rule}", redact(url)));
        let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) else {
            if url.starts_with("rediss://") || url.starts_with("rediss+cluster://") {
                return Err(bad(
                    "TLS (rediss://, rediss+cluster://) is not supported by this build",
                ));
            }
            return Ok(Self::Single(url.to_owned()));
        };
        let (userinfo, hosts) = match rest.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, rest),
        };
        let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
        if hosts.contains('/') || hosts.contains('?') {
            return Err(bad(
                "a cluster URL names seed nodes only (host:port,host:port); a cluster has no database number",
            ));
        }
        let seeds: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|host| match userinfo {
                Some(userinfo) => format!("redis://{userinfo}@{host}/"),
                None => format!("redis://{host}/"),
            })
            .collect();
        if seeds.is_empty() {
            return Err(bad(
                "a cluster URL needs at least one seed node (host:port)",
            ));
        }
        for seed in &seeds {
            seed.as_str()
                .into_connection_info()
                .map_err(|e| bad(&format!("seed {}: {e}", redact(seed))))?;
        }
        Ok(Self::Cluster { seeds })
    }
}

/// `url` with its password replaced, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// A connection to one Redis server or to a Redis Cluster.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(Cluster),
}

/// How long connecting and each answer may take before the command fails
/// (the caller's retry loops decide what then).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl Conn {
    pub async fn open(url: &str) -> StoreResult<Self> {
        // Without TCP_NODELAY (redis-rs leaves it off) a turn's commands
        // wait behind Nagle's algorithm whenever another turn's or the
        // shipper's are still unacknowledged on the shared connection.
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        match RedisTarget::parse(url)? {
            RedisTarget::Single(url) => {
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(unavailable)?
                    .set_tcp_settings(tcp);
                let client = redis::Client::open(info).map_err(unavailable)?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECTION_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map(Self::Single)
                    .map_err(unavailable)
            }
            RedisTarget::Cluster { seeds } => {
                let seeds = seeds
                    .iter()
                    .map(|seed| {
                        seed.as_str()
                            .into_connection_info()
                            .map(|info| info.set_tcp_settings(tcp.clone()))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(unavailable)?;
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECTION_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                Cluster::connect(seeds, config)
                    .await
                    .map(Self::Cluster)
                    .map_err(unavailable)
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Runs each of `pipelines` (each of one slot on a cluster) as
    /// `query_async` would; on a cluster, one request per master for all of
    /// them (see [`Cluster::query_each`]: each must be a transaction or
    /// safe to run twice).
    pub async fn query_each<T: redis::FromRedisValue>(
        &self,
        pipelines: &[Pipeline],
    ) -> Vec<redis::RedisResult<T>> {
        match self {
            Self::Single(_) => {
                let queries = pipelines.iter().map(|pipeline| {
                    let mut conn = self.clone();
                    async move { pipeline.query_async(&mut conn).await }
                });
                futures::future::join_all(queries).await
            }
            Self::Cluster(c) => c.query_each(pipelines).await,
        }
    }
}

use baton_redis_cluster::count_request;
pub use baton_redis_cluster::requests_sent;

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => {
                count_request();
                c.req_packed_command(cmd)
            }
            Self::Cluster(c) => Box::pin(c.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => {
                count_request();
                c.req_packed_commands(pipeline, offset, count)
            }
            Self::Cluster(c) => Box::pin(c.pipeline(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_seeds_and_carry_credentials() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379/0").unwrap(),
            RedisTarget::Single("redis://127.0.0.1:6379/0".into())
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:7000,b:7001/").unwrap(),
            RedisTarget::Cluster {
                seeds: vec!["redis://a:7000/".into(), "redis://b:7001/".into()]
            }
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://:s3cret@a:7000").unwrap(),
            RedisTarget::Cluster {
                seeds: vec!["redis://:s3cret@a:7000/".into()]
            }
        );
        for (url, rule) in [
            ("redis+cluster://", "at least one seed"),
            ("redis+cluster://a:7000/3", "no database number"),
            ("rediss+cluster://a:7000", "TLS"),
            ("rediss://:pw@a:6380/0", "TLS"),
            ("redis+cluster://:pw@a:notaport", "seed"),
        ] {
            let e = RedisTarget::parse(url).unwrap_err().to_string();
            assert!(e.contains(rule), "{url}: {e}");
            assert!(!e.contains("pw@"), "the password stays out: {e}");
        }
    }
}
