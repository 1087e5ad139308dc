//! `baton dev`'s flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use baton_api::validate::parse_duration;

fn duration(value: &str) -> Result<Duration, String> {
    parse_duration(value)
}

fn replica_count(value: &str) -> Result<usize, String> {
    let n: usize = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if (1..=MAX_REPLICAS).contains(&n) {
        Ok(n)
    } else {
        Err(format!("must be between 1 and {MAX_REPLICAS}"))
    }
}

/// Most replicas one machine runs.
pub const MAX_REPLICAS: usize = 16;

#[derive(clap::Args, Clone, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DevArgs {
    #[command(subcommand)]
    pub command: Option<DevCommand>,

    /// Address of the front door (round-robin over the ready replicas).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// How many replicas to run.
    #[arg(long, default_value = "2", value_parser = replica_count)]
    pub replicas: usize,

    /// Where the embedded stores, workspaces and logs live.
    #[arg(long, default_value = ".baton/dev")]
    pub data_dir: PathBuf,

    /// Use this Redis (with `--database-url`) instead of the embedded store.
    #[arg(long)]
    pub redis_url: Option<String>,

    /// Postgres URL of the turn ledger (with `--redis-url`).
    #[arg(long)]
    pub database_url: Option<String>,

    /// Keep workspaces in this S3-compatible store instead of a local directory.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    #[arg(long, default_value = "baton")]
    pub s3_bucket: String,
    #[arg(long, default_value = "us-east-1")]
    pub s3_region: String,
    #[arg(long, env = "AWS_ACCESS_KEY_ID", default_value = "")]
    pub s3_access_key_id: String,
    #[arg(
        long,
        env = "AWS_SECRET_ACCESS_KEY",
        default_value = "",
        hide_env_values = true
    )]
    pub s3_secret_access_key: String,

    #[arg(long, default_value = "30s", value_parser = duration)]
    pub lease_ttl: Duration,
    #[arg(long, default_value = "24h", value_parser = duration)]
    pub state_ttl: Duration,
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub drain_timeout: Duration,
    #[arg(long, default_value = "250ms", value_parser = duration)]
    pub heartbeat_interval: Duration,

    /// Who may sign in to the dashboard (`/dashboard`): a YAML list of
    /// `{name, role: viewer|operator, token}`. Without it the dashboard is
    /// open to everyone as an operator, which `baton dev` allows only on
    /// a loopback `--listen`.
    #[arg(long, env = "BATON_DASHBOARD_TOKENS_FILE")]
    pub dashboard_tokens_file: Option<PathBuf>,

    /// Extra time every turn of the reference agent takes, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub agent_delay_ms: u64,
    /// Share of the reference agent's turns that fail, 0.0 to 1.0.
    #[arg(long, default_value = "0")]
    pub agent_failure_rate: String,
}

#[derive(clap::Subcommand, Clone, Debug)]
pub enum DevCommand {
    /// Replace every replica of a running `baton dev`, one by one: drain,
    /// stop, start, wait until ready.
    Rollout {
        /// The running `baton dev`'s front door.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
    },
}

impl DevArgs {
    pub fn check(&self) -> Result<(), String> {
        if self.redis_url.is_some() != self.database_url.is_some() {
            return Err(
                "--redis-url and --database-url go together (Redis coordinates, Postgres keeps the ledger)"
                    .into(),
            );
        }
        Ok(())
    }
}
