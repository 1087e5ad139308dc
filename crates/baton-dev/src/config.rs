//! `baton dev`'s flags.

use std::net::SocketAddr;
use std::path::PathBuf;
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
    /// A URL with a password belongs in the environment, not on the
    /// command line (every local user can read a command line); the
    /// replicas get it through theirs.
    #[arg(long, env = "BATON_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// Postgres URL of the turn ledger (with `--redis-url`); as for
    /// `--redis-url`, pass one with a password in the environment.
    #[arg(long, env = "BATON_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// The workspace store; without `--s3-endpoint` a directory under
    /// `--data-dir`.
    #[command(flatten)]
    pub s3: baton_workspace::cli::S3Args,

    /// The replicas' protocol timings (as `baton sidecar` has them).
    #[command(flatten)]
    pub timing: baton_sidecar::config::TimingArgs,

    /// Who may sign in to the dashboard (`/dashboard`): a YAML list of
    /// `{name, role: viewer|operator, token}`. Without it the dashboard is
    /// open to everyone as an operator, which `baton dev` allows only on
    /// a loopback `--listen`.
    #[arg(long, env = "BATON_DASHBOARD_TOKENS_FILE", hide_env_values = true)]
    pub dashboard_tokens_file: Option<PathBuf>,

    /// Extra time every turn of the reference agent takes, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub agent_delay_ms: u64,

    /// The reference agent streams each reply in this many pieces (0: only
    /// the replies asked for with `/stream <chunks> <ms> [text]`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub agent_stream_chunks: u16,

    /// The pause between two streamed pieces, in milliseconds (0 by
    /// default: a turn through `baton dev` takes no longer than before;
    /// `--agent-stream-interval-ms 50` shows the words coming one by one).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub agent_stream_interval_ms: u64,

    /// What the turn ledger keeps of each turn: `full` (what was said, the
    /// dashboard shows it) or `digest` (SHA-256 digests alone).
    #[arg(long, default_value = "full", value_parser = |v: &str| v.parse::<baton_api::LedgerContent>())]
    pub ledger_content: baton_api::LedgerContent,

    /// How long the ledger keeps turn records (`30d`, `720h`); unset: always.
    #[arg(long, value_parser = baton_api::validate::parse_retention)]
    pub ledger_retention: Option<std::time::Duration>,

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
        /// File holding an operator's token of the running `baton dev`'s
        /// `--dashboard-tokens-file` (needed when it has one). A file, not
        /// a flag's value: a command line is readable by every local user.
        #[arg(long, env = "BATON_DASHBOARD_TOKEN_FILE", hide_env_values = true)]
        token_file: Option<PathBuf>,
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
