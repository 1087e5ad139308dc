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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crd => manifest::crd_yaml().and_then(|yaml| write_stdout(&yaml)),
        Command::Validate { file } => manifest::load(&file).map(|(_, valid)| {
            println!("{}: valid AgentDeployment {:?}", file.display(), valid.name);
        }),
        Command::Render { file, credentials } => render(&file, credentials.as_deref()),
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

/// Writes to standard output; a closed pipe (`baton crd | head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
