//! The sidecar's settings: the environment the operator injects into every
//! pod (`BATON_*`), with an equivalent flag for each.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use baton_api::constants::env;
use baton_api::validate::parse_duration;

fn duration(value: &str) -> Result<Duration, String> {
    parse_duration(value)
}

fn parse_ledger_content(value: &str) -> Result<baton_api::LedgerContent, String> {
    value.parse()
}

/// Largest request body a sidecar accepts unless told otherwise; `baton
/// dev`'s front door refuses larger ones before reading them.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// Settings of one sidecar.
/// The turn protocol's timings: the sidecar's flags, and `baton dev`'s,
/// which passes them on to its replicas (one source for both helps).
#[derive(clap::Args, Clone, Debug)]
pub struct TimingArgs {
    /// How long a turn's lease lasts without renewal.
    #[arg(long, env = env::LEASE_TTL, default_value = "30s", value_parser = duration, hide_env_values = true)]
    pub lease_ttl: Duration,

    /// How long an idle session's state is kept.
    #[arg(long, env = env::STATE_TTL, default_value = "24h", value_parser = duration, hide_env_values = true)]
    pub state_ttl: Duration,

    /// How long a drain waits for in-flight turns before aborting them.
    #[arg(long, env = env::DRAIN_TIMEOUT, default_value = "30s", value_parser = duration, hide_env_values = true)]
    pub drain_timeout: Duration,

    /// How often this replica refreshes its liveness key; its leases are
    /// free three missed beats after it dies.
    #[arg(long, env = env::HEARTBEAT_INTERVAL, default_value = "250ms", value_parser = duration, hide_env_values = true)]
    pub heartbeat_interval: Duration,
}

impl TimingArgs {
    /// The same timings as `baton sidecar` flags, for a sidecar process
    /// started with them (`baton dev`'s replicas).
    pub fn pass_to(&self, cmd: &mut tokio::process::Command) {
        for (flag, value) in [
            ("--lease-ttl", self.lease_ttl),
            ("--state-ttl", self.state_ttl),
            ("--drain-timeout", self.drain_timeout),
            ("--heartbeat-interval", self.heartbeat_interval),
        ] {
            cmd.arg(format!("{flag}={}ms", value.as_millis()));
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct SidecarArgs {
    /// This replica's name (the pod name under Kubernetes).
    #[arg(long, env = env::REPLICA_ID, hide_env_values = true)]
    pub replica_id: String,

    /// Address of the turn, probe and metrics API, and of the admin API
    /// unless `--admin-listen` gives it its own.
    #[arg(long, env = env::LISTEN, default_value = "127.0.0.1:7070", hide_env_values = true)]
    pub listen: SocketAddr,

    /// Address of the admin API (drain, status, handover, takeover) alone;
    /// `--listen` then serves no admin route. The operator sets it, so a
    /// NetworkPolicy can admit only the operator and the dashboard to it.
    #[arg(long, env = env::ADMIN_LISTEN, hide_env_values = true)]
    pub admin_listen: Option<SocketAddr>,

    /// The URL at which others reach this sidecar's admin API (under
    /// Kubernetes `http://$(POD_IP):<admin port>`), said with every
    /// heartbeat: the dashboard drains the replica there. Unset: the dashboard cannot
    /// drain it.
    #[arg(long, env = env::ADVERTISE_URL, hide_env_values = true)]
    pub advertise_url: Option<String>,

    /// Advertise the address the admin API is bound to (`http://` and the
    /// bound address): for a sidecar on loopback whose port the system
    /// picked (`--listen 127.0.0.1:0`), as `baton dev` starts its replicas.
    #[arg(long, conflicts_with = "advertise_url", default_value_t = false)]
    pub advertise_bound_address: bool,

    /// Take over stores that hold another data layout once no replica of
    /// that layout is alive (the operator sets it for
    /// `spec.rollout.migrateLayout`). Without it, a replica whose layout
    /// differs from the stores' serves no turn.
    #[arg(long, env = env::ADOPT_LAYOUT, default_value_t = false, action = clap::ArgAction::Set, hide_env_values = true)]
    pub adopt_layout: bool,

    /// The data layout this replica says it writes. For tests that stand
    /// in for another build; leave it alone.
    #[arg(long, env = "BATON_DATA_LAYOUT", default_value_t = baton_session::DATA_LAYOUT, hide = true, hide_env_values = true)]
    pub data_layout: u32,

    /// Base URL of the agent (the contract's `POST /v1/turn` is appended).
    #[arg(long, env = env::AGENT_URL, default_value = "http://127.0.0.1:8080", hide_env_values = true)]
    pub agent_url: String,

    /// Where session workspaces are materialised for the agent.
    #[arg(long, env = env::WORKSPACE_DIR, default_value = ".baton/workspace", hide_env_values = true)]
    pub workspace_dir: PathBuf,

    #[command(flatten)]
    pub timing: TimingArgs,

    /// How often a running turn renews its lease (default: a third of the lease TTL).
    #[arg(long, env = env::RENEW_INTERVAL, value_parser = duration, hide_env_values = true)]
    pub renew_interval: Option<Duration>,

    /// Longest an agent call may take before the turn is aborted (504).
    #[arg(long, env = "BATON_AGENT_TIMEOUT", default_value = "10m", value_parser = duration, hide_env_values = true)]
    pub agent_timeout: Duration,

    /// Redis URL of the coordination store. With it, `--database-url` is required.
    #[arg(long, env = env::REDIS_URL, hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Postgres URL of the turn ledger (with `--redis-url`).
    #[arg(long, env = env::DATABASE_URL, hide_env_values = true)]
    pub database_url: Option<String>,

    /// How much of idle session directories this replica keeps between
    /// turns (MiB, as their files count), least recently used evicted first;
    /// an evicted session's next turn downloads its files again.
    #[arg(long, env = env::WORKSPACE_CACHE_MIB, default_value_t = 2048, hide_env_values = true)]
    pub workspace_cache_mib: u64,

    /// How often one replica (whichever holds the collector lease) deletes
    /// the workspace manifests and blobs no session uses (`0s`: never).
    /// Garbage goes at the second run that finds it, so this must be longer
    /// than the longest turn (`--agent-timeout` plus `--lease-ttl`).
    #[arg(long, env = env::WORKSPACE_GC_INTERVAL, default_value = "1h", value_parser = duration, hide_env_values = true)]
    pub workspace_gc_interval: Duration,

    /// Workspace manifests and blobs younger than this are never deleted.
    #[arg(long, env = env::WORKSPACE_GC_RETENTION, default_value = "24h", value_parser = duration, hide_env_values = true)]
    pub workspace_gc_retention: Duration,

    /// What the turn ledger keeps of each turn: `full` (its input and
    /// reply, beside their SHA-256 digests: the dashboard shows what was
    /// said) or `digest` (the digests alone).
    #[arg(long, env = env::LEDGER_CONTENT, default_value = "full", value_parser = parse_ledger_content, hide_env_values = true)]
    pub ledger_content: baton_api::LedgerContent,

    /// How long the ledger keeps turn records after their commit (`30d`,
    /// `720h`); unset: as long as the ledger. Every replica deletes older
    /// ones every 10 minutes.
    #[arg(long, env = env::LEDGER_RETENTION, value_parser = baton_api::validate::parse_retention, hide_env_values = true)]
    pub ledger_retention: Option<Duration>,

    /// Keeps this deployment's Redis keys, ledger tables (a Postgres schema)
    /// and workspace objects apart from other deployments on the same
    /// servers; the operator sets `<namespace>.<name>`. Empty: the layout
    /// without namespaces. Up to 253 characters of `A-Z a-z 0-9 . _ -`.
    /// The embedded store (one machine) ignores it.
    #[arg(long, env = env::STORE_NAMESPACE, default_value = "", hide_env_values = true)]
    pub store_namespace: String,

    /// Embedded store (no servers): SQLite database file shared by every
    /// replica process of the machine. Used when `--redis-url` is absent.
    #[arg(
        long,
        env = "BATON_SQLITE_PATH",
        default_value = ".baton/baton.db",
        hide_env_values = true
    )]
    pub sqlite_path: PathBuf,

    #[command(flatten)]
    pub workspace: baton_workspace::cli::WorkspaceArgs,

    /// Bearer tokens allowed to call the turn and admin APIs, as
    /// `token=tenant` pairs separated by commas. Without it, authentication
    /// is off and the tenant comes from the `X-Baton-Tenant` header
    /// (default `default`).
    #[arg(long, env = "BATON_AUTH_TOKENS", hide_env_values = true)]
    pub auth_tokens: Option<String>,

    /// Bearer tokens of operators for the admin API (drain, status,
    /// handover, takeover), separated by commas. With either token list
    /// set, the admin API takes only these, from every address (loopback
    /// too). Set alone, they leave the turn API as without authentication.
    #[arg(long, env = "BATON_ADMIN_TOKENS", hide_env_values = true)]
    pub admin_tokens: Option<String>,

    /// Runtime threads, each a single-threaded runtime serving its share of
    /// the connections; 0 means one per core (the pod's CPU limit counts).
    /// One (the default) costs the least CPU per turn and was as fast as two
    /// on two shared cores (see BENCHMARKS.md); give more to a sidecar that
    /// has more cores to itself.
    #[arg(
        long,
        env = "BATON_WORKER_THREADS",
        default_value_t = 1,
        hide_env_values = true
    )]
    pub worker_threads: usize,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "BATON_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES, hide_env_values = true)]
    pub max_body_bytes: usize,

    /// Largest turn input accepted, in bytes.
    #[arg(long, env = "BATON_MAX_INPUT_BYTES", default_value_t = 256 * 1024, hide_env_values = true)]
    pub max_input_bytes: usize,
}

impl SidecarArgs {
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval.unwrap_or(self.timing.lease_ttl / 3)
    }

    /// A heartbeat key lives three beats: one or two lost writes do not
    /// make a live replica look dead.
    pub fn heartbeat_ttl(&self) -> Duration {
        self.timing.heartbeat_interval * 3
    }

    /// Rules the flags cannot express; every violation names its setting.
    pub fn check(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.timing.lease_ttl < Duration::from_secs(1) {
            problems.push(format!("{}: must be at least 1s", env::LEASE_TTL));
        }
        if self.renew_interval() >= self.timing.lease_ttl || self.renew_interval().is_zero() {
            problems.push(format!(
                "{}: must be greater than 0 and shorter than {}",
                env::RENEW_INTERVAL,
                env::LEASE_TTL
            ));
        }
        if self.timing.heartbeat_interval < Duration::from_millis(50)
            || self.timing.heartbeat_interval >= self.timing.lease_ttl
        {
            problems.push(format!(
                "{}: must be at least 50ms and shorter than {}",
                env::HEARTBEAT_INTERVAL,
                env::LEASE_TTL
            ));
        }
        if self.redis_url.is_some() != self.database_url.is_some() {
            problems.push(format!(
                "{} and {}: give both (Redis coordinates, Postgres keeps the ledger) or neither (embedded SQLite)",
                env::REDIS_URL,
                env::DATABASE_URL
            ));
        }
        let namespace = &self.store_namespace;
        if namespace.len() > 253
            || !namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            problems.push(format!(
                "{}: {:?} must be at most 253 characters of A-Z a-z 0-9 . _ -",
                env::STORE_NAMESPACE,
                namespace.chars().take(64).collect::<String>()
            ));
        }
        let longest_turn = self.agent_timeout + self.timing.lease_ttl;
        if !self.workspace_gc_interval.is_zero() && self.workspace_gc_interval <= longest_turn {
            problems.push(format!(
                "{}: must be 0s (off) or longer than the longest turn, BATON_AGENT_TIMEOUT plus {} ({})",
                env::WORKSPACE_GC_INTERVAL,
                env::LEASE_TTL,
                baton_api::validate::format_duration(longest_turn)
            ));
        }
        if let Err(e) = crate::agent_client::turn_uri(&self.agent_url) {
            problems.push(format!("{}: {e}", env::AGENT_URL));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SidecarArgs,
    }

    fn check(extra: &[&str]) -> Result<(), String> {
        let argv = ["sidecar", "--replica-id=r-0"].iter().chain(extra);
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .args
            .check()
    }

    #[test]
    fn the_store_namespace_is_checked() {
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&["--store-namespace=prod.agent-1"]), Ok(()));
        for bad in ["a/b", "a b", "ns:x", &"n".repeat(254)] {
            let e = check(&[&format!("--store-namespace={bad}")]).unwrap_err();
            assert!(e.contains("BATON_STORE_NAMESPACE"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_collector_runs_further_apart_than_the_longest_turn() {
        assert_eq!(check(&["--workspace-gc-interval=0s"]), Ok(()));
        assert_eq!(
            check(&["--workspace-gc-interval=11m", "--agent-timeout=10m"]),
            Ok(())
        );
        let e = check(&["--workspace-gc-interval=10m", "--agent-timeout=10m"]).unwrap_err();
        assert!(
            e.contains("BATON_WORKSPACE_GC_INTERVAL") && e.contains("10m30s"),
            "{e}"
        );
    }
}
