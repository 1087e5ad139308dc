//! `baton`: the command line every user and test drives.
#![forbid(unsafe_code)]

mod manifest;
mod reference;
mod yaml;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

// The sidecar, agent and load generator allocate and free small buffers on
// every turn (headers, JSON, Redis replies); with glibc's allocator that was
// about a quarter of the sidecar's instructions (callgrind, see BENCHMARKS.md).
// Built without transparent huge pages (`no_thp`): with them, every region
// mimalloc touched counted 2 MiB resident, which made an idle operator 30
// MiB and one watching 100 resources 54 MiB (14 MiB and 28 MiB without).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    Crd {
        /// Print the field reference (Markdown) generated from its schema instead.
        #[arg(long)]
        reference: bool,
    },
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
        /// Credentials of the managed stores and the sidecars' admin token
        /// (YAML with redisPassword, postgresPassword,
        /// objectStoreAccessKeyId, objectStoreSecretAccessKey, adminToken).
        /// Fresh random ones when omitted.
        #[arg(long, env = "BATON_CREDENTIALS_FILE", hide_env_values = true)]
        credentials: Option<PathBuf>,
        /// Render the NetworkPolicies, as the operator does by default
        /// (its `--network-policies`).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        network_policies: bool,
        /// The operator's namespace: its pods and the dashboard's, labelled
        /// `baton.dev/admin-client: "true"`, reach the admin API.
        #[arg(long, default_value = "baton-system")]
        operator_namespace: String,
    },
    /// Run the reference agent (deterministic, offline) on the agent contract.
    Agent {
        /// Address to listen on; port 0 picks a free one (printed at start).
        #[arg(
            long,
            env = "BATON_AGENT_LISTEN",
            default_value = "127.0.0.1:8081",
            hide_env_values = true
        )]
        listen: std::net::SocketAddr,
        /// Extra time every turn takes, in milliseconds.
        #[arg(
            long,
            env = "BATON_AGENT_DELAY_MS",
            default_value_t = 0,
            hide_env_values = true
        )]
        delay_ms: u64,
        /// Share of turns that fail, 0.0 to 1.0.
        #[arg(long, env = "BATON_AGENT_FAILURE_RATE", default_value_t = 0.0, value_parser = failure_rate, hide_env_values = true)]
        failure_rate: f64,
        /// Seed of the failure draws, so a run can be replayed.
        #[arg(
            long,
            env = "BATON_AGENT_SEED",
            default_value_t = 1,
            hide_env_values = true
        )]
        seed: u64,
        /// Do not append turns to notes.md (an echo-speed agent for benchmarks).
        #[arg(long)]
        no_notes: bool,
        /// Stream every reply in this many pieces to a caller that accepts
        /// a stream (the sidecar does); 0 streams only `/stream` replies.
        #[arg(long, env = "BATON_AGENT_STREAM_CHUNKS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1000), hide_env_values = true)]
        stream_chunks: u16,
        /// The pause between two streamed pieces, in milliseconds.
        #[arg(long, env = "BATON_AGENT_STREAM_INTERVAL_MS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000), hide_env_values = true)]
        stream_interval_ms: u64,
    },
    /// Run the sidecar of one replica: the turn protocol around an agent,
    /// configured by the BATON_* environment the operator injects.
    Sidecar(Box<baton_sidecar::SidecarArgs>),
    /// Run Baton on this machine: replicas, a front door, embedded stores.
    Dev(Box<baton_dev::DevArgs>),
    /// Run the Kubernetes operator (reconciles AgentDeployments), or print
    /// its RBAC with `baton operator rbac`.
    Operator(Box<baton_operator::OperatorArgs>),
    /// Follow, pause, resume or restart the rolling release of an
    /// AgentDeployment (`baton rollout status agd/NAME`).
    Rollout(Box<baton_operator::rollout_cli::RolloutArgs>),
    /// Serve the control-plane dashboard (sessions, leases, turns) over a
    /// deployment's stores, or `baton dev`'s embedded one.
    Dashboard(Box<baton_web::server::DashboardArgs>),
    /// Load-test a Baton URL (or an agent directly) and report turns/s,
    /// latency and outcomes; `--verify` checks no turn was lost or repeated.
    Bench(Box<baton_loadgen::BenchArgs>),
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
    init_logging();
    exit_with_parent();
    let result = match cli.command {
        Command::Crd { reference: false } => {
            manifest::crd_yaml().and_then(|yaml| write_stdout(&yaml))
        }
        Command::Crd { reference: true } => {
            let crd = serde_json::to_value(
                <baton_api::AgentDeployment as kube::CustomResourceExt>::crd(),
            );
            crd.map_err(anyhow::Error::from)
                .and_then(|crd| reference::markdown(&crd).map_err(anyhow::Error::msg))
                .and_then(|page| write_stdout(&page))
        }
        Command::Validate { file } => manifest::load(&file).map(|(_, valid)| {
            println!("{}: valid AgentDeployment {:?}", file.display(), valid.name);
        }),
        Command::Render {
            file,
            credentials,
            network_policies,
            operator_namespace,
        } => {
            let platform = baton_resources::Platform {
                network_policies: network_policies.then_some(baton_resources::AdminClients {
                    namespace: operator_namespace,
                }),
            };
            render(&file, credentials.as_deref(), &platform)
        }
        Command::Agent {
            listen,
            delay_ms,
            failure_rate,
            seed,
            no_notes,
            stream_chunks,
            stream_interval_ms,
        } => {
            let config = baton_agent::AgentConfig {
                no_notes,
                delay: std::time::Duration::from_millis(delay_ms),
                failure_rate,
                seed,
                stream_chunks: stream_chunks.into(),
                stream_interval: std::time::Duration::from_millis(stream_interval_ms),
            };
            run_agent(listen, config)
        }
        // One thread here; the sidecar starts its other runtime threads.
        Command::Sidecar(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| runtime.block_on(baton_sidecar::run(*args))),
        Command::Dashboard(args) => block_on(async move {
            baton_web::server::run(*args)
                .await
                .map_err(anyhow::Error::msg)
        }),
        Command::Dev(args) => std::env::current_exe()
            .context("finding the baton binary to start replicas with")
            .and_then(|exe| block_on(baton_dev::run(*args, exe))),
        Command::Operator(args) => match args.command {
            Some(baton_operator::OperatorCommand::Rbac { rules: true, .. }) => {
                baton_operator::rbac::rules_yaml()
                    .map_err(anyhow::Error::from)
                    .and_then(|yaml| write_stdout(&yaml))
            }
            Some(baton_operator::OperatorCommand::Rbac {
                operator_namespace,
                namespace,
                rules: false,
            }) => baton_operator::rbac::yaml(&baton_operator::rbac::RbacOptions {
                operator_namespace: &operator_namespace,
                watch_namespace: namespace.as_deref(),
                without_rule: None,
            })
            .map_err(anyhow::Error::from)
            .and_then(|yaml| write_stdout(&yaml)),
            None => block_on(baton_operator::run(args.run)),
        },
        Command::Rollout(args) => block_on(baton_operator::rollout_cli::run(*args)),
        Command::Bench(args) => {
            let json = args.json;
            block_on(baton_loadgen::run(*args)).and_then(|report| {
                if json {
                    write_stdout(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
                } else {
                    write_stdout(&baton_loadgen::render(&report))?;
                }
                // Scripts and CI read the exit status.
                anyhow::ensure!(
                    report.passed(),
                    "{} turns failed, {} sessions failed verification",
                    report.failed,
                    report.verify_errors.len()
                );
                Ok(())
            })
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

fn render(
    file: &std::path::Path,
    credentials: Option<&std::path::Path>,
    platform: &baton_resources::Platform,
) -> anyhow::Result<()> {
    let (_, valid) = manifest::load(file)?;
    let creds = match credentials {
        Some(path) => {
            let text = manifest::read_text(path)?;
            serde_yaml::from_str(&text)
                .with_context(|| format!("reading credentials from {}", path.display()))?
        }
        None => baton_resources::Credentials::generate(),
    };
    write_stdout(&manifest::render(
        &valid,
        &creds,
        platform,
        credentials.is_none(),
    )?)
}

fn block_on<T>(future: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Runtime::new()?.block_on(future)
}

/// Logs to standard error: `RUST_LOG` filters (default `info`),
/// `BATON_LOG_FORMAT=json` gives one JSON object per line.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only on a terminal: a log file or a pipe gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if std::env::var("BATON_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.compact().init();
    }
}

/// With `BATON_EXIT_WITH_PARENT=1` (set by `baton dev` for its replicas),
/// exit as soon as the parent process is gone, so a killed `baton dev`
/// leaves no replica behind.
fn exit_with_parent() {
    if std::env::var("BATON_EXIT_WITH_PARENT").is_err() {
        return;
    }
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(250));
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(1);
            }
        }
    });
}

fn run_agent(listen: std::net::SocketAddr, config: baton_agent::AgentConfig) -> anyhow::Result<()> {
    // One thread, like the sidecar: the reference agent's turns are short
    // and it shares the machine with the sidecar and the stores.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
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
