//! `baton`: the command line every user and test drives.
#![forbid(unsafe_code)]

mod manifest;
mod yaml;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Run stateful AI agents on Kubernetes without losing a turn"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the AgentDeployment CustomResourceDefinition as YAML.
    Crd,
    /// Check an AgentDeployment manifest; print every violation.
    Validate {
        /// The manifest (YAML or JSON); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// Print, as multi-document YAML, every object the operator applies for
    /// an AgentDeployment (like `helm template`).
    Render {
        /// The manifest (YAML or JSON); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        /// Credentials of the managed stores (YAML with redisPassword,
        /// postgresPassword, objectStoreAccessKeyId,
        /// objectStoreSecretAccessKey). Fresh random ones when omitted.
        #[arg(long, env = "BATON_CREDENTIALS_FILE")]
        credentials: Option<PathBuf>,
    },
    /// Run the reference agent (deterministic, offline) on the agent contract.
    Agent {
        /// Address to listen on; port 0 picks a free one (printed at start).
        #[arg(long, env = "BATON_AGENT_LISTEN", default_value = "127.0.0.1:8081")]
        listen: std::net::SocketAddr,
        /// Extra time every turn takes, in milliseconds.
        #[arg(long, env = "BATON_AGENT_DELAY_MS", default_value_t = 0)]
        delay_ms: u64,
        /// Share of turns that fail, 0.0 to 1.0.
        #[arg(long, env = "BATON_AGENT_FAILURE_RATE", default_value_t = 0.0, value_parser = failure_rate)]
        failure_rate: f64,
        /// Seed of the failure draws, so a run can be replayed.
        #[arg(long, env = "BATON_AGENT_SEED", default_value_t = 1)]
        seed: u64,
    },
}

fn failure_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!("{rate} must be between 0.0 and 1.0"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crd => manifest::crd_yaml().and_then(|yaml| write_stdout(&yaml)),
        Command::Validate { file } => manifest::load(&file).map(|(_, valid)| {
            println!("{}: valid AgentDeployment {:?}", file.display(), valid.name);
        }),
        Command::Render { file, credentials } => render(&file, credentials.as_deref()),
        Command::Agent {
            listen,
            delay_ms,
            failure_rate,
            seed,
        } => {
            let config = baton_agent::AgentConfig {
                delay: std::time::Duration::from_millis(delay_ms),
                failure_rate,
                seed,
            };
            run_agent(listen, config)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn render(file: &std::path::Path, credentials: Option<&std::path::Path>) -> anyhow::Result<()> {
    let (_, valid) = manifest::load(file)?;
    let creds = match credentials {
        Some(path) => {
            let text = manifest::read_text(path)?;
            serde_yaml::from_str(&text)
                .with_context(|| format!("reading credentials from {}", path.display()))?
        }
        None => baton_resources::Credentials::generate(),
    };
    write_stdout(&manifest::render(&valid, &creds, credentials.is_none())?)
}

fn run_agent(listen: std::net::SocketAddr, config: baton_agent::AgentConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        write_stdout(&format!(
            "baton agent listening on http://{}\n",
            listener.local_addr()?
        ))?;
        baton_agent::serve(listener, config).await?;
        Ok(())
    })
}

/// Writes to standard output; a closed pipe (`baton crd | head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
