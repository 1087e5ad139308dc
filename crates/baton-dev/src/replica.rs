//! One replica slot: the sidecar and reference agent processes of a
//! "pod", restarted when they die (like a StatefulSet) and replaced on
//! request (a rollout).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::sync::{Notify, watch};

use crate::config::DevArgs;

/// What `GET /v1/dev/replicas` shows of a replica.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub id: String,
    pub url: String,
    pub agent_url: String,
    /// The sidecar's process id, while it runs.
    pub pid: Option<u32>,
    pub agent_pid: Option<u32>,
    pub ready: bool,
    pub draining: bool,
    /// Times the processes died and were started again.
    pub restarts: u64,
    /// Times a rollout replaced them.
    pub generation: u64,
}

pub struct ReplicaSlot {
    pub id: String,
    status: Mutex<ReplicaStatus>,
    replace: Notify,
    /// Whether the current processes have been ready once.
    ready_once: std::sync::atomic::AtomicBool,
}

/// A replica's first processes died before they were ever ready: a
/// setting they refuse, not a crash to restart.
#[derive(Debug)]
pub struct NeverReady {
    pub replica: String,
    pub why: String,
    /// The end of the log of the process that died.
    pub log_tail: String,
}

impl std::fmt::Display for NeverReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} before it was ever ready, so baton dev stops (a setting is probably wrong):\n{}",
            self.replica, self.why, self.log_tail
        )
    }
}

impl std::error::Error for NeverReady {}

/// Restarts of a replica that did run back off from the first to the cap;
/// one that then stays up this long starts again from the first.
const RESTART_FIRST: Duration = Duration::from_millis(200);
const RESTART_CAP: Duration = Duration::from_secs(5);
const STAYED_UP: Duration = Duration::from_secs(10);
/// A replica that has never been ready and died this many starts in a row
/// stops `baton dev`.
const NEVER_READY_STARTS: u32 = 3;

/// Why a replica's processes stopped.
enum Stop {
    /// Which log to show, and how it ended.
    Died(&'static str, String),
    Replace,
    Shutdown,
}

/// How to start a replica's processes.
pub struct Launcher {
    pub exe: PathBuf,
    pub args: DevArgs,
}

impl ReplicaSlot {
    pub fn new(id: String) -> Self {
        let status = ReplicaStatus {
            id: id.clone(),
            ..ReplicaStatus::default()
        };
        Self {
            id,
            status: Mutex::new(status),
            replace: Notify::new(),
            ready_once: Default::default(),
        }
    }

    /// The sidecar's URL, while its processes run. Each start binds ports
    /// the system picks and says which, so a start never depends on a port
    /// staying free after someone looked.
    pub fn url(&self) -> Option<String> {
        let s = self.lock();
        (s.pid.is_some() && !s.url.is_empty()).then(|| s.url.clone())
    }

    pub fn status(&self) -> ReplicaStatus {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReplicaStatus> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_probe(&self, ready: bool, draining: bool) {
        let mut s = self.lock();
        // A probe that raced with a restart must not mark the new processes.
        if s.pid.is_some() {
            s.ready = ready;
            s.draining = draining;
            if ready {
                self.ready_once
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Asks the supervisor to stop the processes gracefully and start new ones.
    pub fn request_replace(&self) {
        self.replace.notify_one();
    }

    fn workspace_dir(&self, args: &DevArgs) -> PathBuf {
        args.data_dir
            .join("replicas")
            .join(&self.id)
            .join("workspace")
    }

    fn log_file(&self, args: &DevArgs, name: &str) -> std::io::Result<std::fs::File> {
        let dir = args.data_dir.join("replicas").join(&self.id);
        std::fs::create_dir_all(&dir)?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(name))
    }

    /// Starts the agent, then the sidecar calling it, each on a port the
    /// system picks; returns them with the URLs they printed.
    async fn spawn(&self, launcher: &Launcher) -> std::io::Result<Started> {
        let args = &launcher.args;
        let agent_log = self.log_file(args, "agent.log")?;
        let mut agent = Command::new(&launcher.exe);
        agent
            .arg("agent")
            .arg("--listen=127.0.0.1:0")
            .arg(format!("--delay-ms={}", args.agent_delay_ms))
            .arg(format!("--stream-chunks={}", args.agent_stream_chunks))
            .arg(format!(
                "--stream-interval-ms={}",
                args.agent_stream_interval_ms
            ))
            .arg(format!("--failure-rate={}", args.agent_failure_rate));
        let mut agent = with_common(&mut agent, agent_log.try_clone()?)?.spawn()?;
        // `agent` is killed on drop if the sidecar cannot start.
        let agent_url = printed_url(&mut agent, agent_log, "the agent").await?;

        let sidecar_log = self.log_file(args, "sidecar.log")?;
        let mut sidecar = Command::new(&launcher.exe);
        // `baton dev`'s settings alone choose the stores (its flags, or the
        // same names in its environment): nothing else of the environment
        // may send the replicas elsewhere than the banner and the
        // dashboard say.
        for store_setting in [
            "BATON_REDIS_URL",
            "BATON_DATABASE_URL",
            "BATON_SQLITE_PATH",
            "BATON_STORE_NAMESPACE",
            "BATON_OBJECTS_DIR",
            "BATON_S3_ENDPOINT",
            "BATON_S3_BUCKET",
            "BATON_S3_REGION",
            "BATON_S3_ACCESS_KEY_ID",
            "BATON_S3_SECRET_ACCESS_KEY",
            "BATON_S3_FORCE_PATH_STYLE",
        ] {
            sidecar.env_remove(store_setting);
        }
        sidecar
            .arg("sidecar")
            .arg(format!("--replica-id={}", self.id))
            .arg("--listen=127.0.0.1:0")
            .arg("--advertise-bound-address")
            .arg(format!("--agent-url={agent_url}"))
            .arg("--workspace-dir")
            .arg(self.workspace_dir(args));
        args.timing.pass_to(&mut sidecar);
        sidecar.arg(format!("--ledger-content={}", args.ledger_content.as_str()));
        if let Some(retention) = args.ledger_retention {
            sidecar.arg(format!("--ledger-retention={}ms", retention.as_millis()));
        }
        match (&args.redis_url, &args.database_url) {
            // In the environment, not the command line: the URLs may hold
            // passwords, and any local user can read a command line.
            (Some(redis), Some(database)) => {
                sidecar.env("BATON_REDIS_URL", redis);
                sidecar.env("BATON_DATABASE_URL", database);
            }
            _ => {
                sidecar
                    .arg("--sqlite-path")
                    .arg(args.data_dir.join("baton.db"));
            }
        }
        if args.s3.s3_endpoint.is_some() {
            args.s3.pass_to(&mut sidecar);
        } else {
            sidecar
                .arg("--objects-dir")
                .arg(args.data_dir.join("objects"));
        }
        let mut sidecar = with_common(&mut sidecar, sidecar_log.try_clone()?)?.spawn()?;
        // A sidecar that dies before it listens (a setting it refuses)
        // prints no URL: the supervisor sees it exit and reports its log.
        let url = printed_url(&mut sidecar, sidecar_log, "the sidecar")
            .await
            .ok();
        Ok(Started {
            agent,
            sidecar,
            agent_url,
            url,
        })
    }

    fn log_path(&self, args: &DevArgs, name: &str) -> PathBuf {
        args.data_dir.join("replicas").join(&self.id).join(name)
    }

    /// How long each log is now: what the next start writes comes after.
    fn log_lengths(&self, args: &DevArgs) -> [u64; 2] {
        ["sidecar.log", "agent.log"]
            .map(|name| std::fs::metadata(self.log_path(args, name)).map_or(0, |m| m.len()))
    }

    /// The last lines one of the replica's logs got since `from`.
    fn log_tail(&self, args: &DevArgs, name: &str, from: [u64; 2]) -> String {
        let path = self.log_path(args, name);
        let skip = if name == "sidecar.log" {
            from[0]
        } else {
            from[1]
        };
        let bytes = std::fs::read(&path).unwrap_or_default();
        let text = String::from_utf8_lossy(bytes.get(skip as usize..).unwrap_or_default());
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join("\n");
        format!("--- {} (last lines) ---\n{tail}", path.display())
    }

    /// Keeps the replica's processes running until `shutdown`. Returns
    /// an error, and stops trying, when its processes died before they
    /// were ever ready three starts in a row: a configuration problem that
    /// restarts would only repeat.
    pub async fn supervise(
        &self,
        launcher: &Launcher,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), NeverReady> {
        // Starts that died before any start was ever ready. One can be bad
        // luck; a setting the sidecar refuses fails every time.
        let mut unready_deaths = 0;
        let mut ever_ready = false;
        let mut backoff = RESTART_FIRST;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let logged_before = self.log_lengths(&launcher.args);
            let Started {
                mut agent,
                mut sidecar,
                agent_url,
                url,
            } = match self.spawn(launcher).await {
                Ok(started) => started,
                Err(e) => {
                    if !ever_ready {
                        unready_deaths += 1;
                        if unready_deaths >= NEVER_READY_STARTS {
                            return Err(NeverReady {
                                replica: self.id.clone(),
                                why: format!("could not start: {e}"),
                                log_tail: self.log_tail(&launcher.args, "agent.log", logged_before),
                            });
                        }
                    }
                    eprintln!("baton dev: {} could not start: {e}; retrying", self.id);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            {
                let mut s = self.lock();
                s.pid = sidecar.id();
                s.agent_pid = agent.id();
                s.url = url.unwrap_or_default();
                s.agent_url = agent_url;
                s.ready = false;
                s.draining = false;
            }
            self.ready_once
                .store(false, std::sync::atomic::Ordering::Relaxed);
            let started = std::time::Instant::now();
            let stop = tokio::select! {
                status = sidecar.wait() => Stop::Died("sidecar.log", format!("sidecar exited ({})", describe(status))),
                status = agent.wait() => Stop::Died("agent.log", format!("agent exited ({})", describe(status))),
                () = self.replace.notified() => Stop::Replace,
                _ = shutdown.changed() => Stop::Shutdown,
            };
            let graceful = !matches!(stop, Stop::Died(..));
            stop_processes(
                &mut sidecar,
                &mut agent,
                graceful,
                launcher.args.timing.drain_timeout,
            )
            .await;
            {
                let mut s = self.lock();
                s.pid = None;
                s.agent_pid = None;
                s.url.clear();
                s.agent_url.clear();
                s.ready = false;
                s.draining = false;
                match stop {
                    Stop::Died(..) => s.restarts += 1,
                    Stop::Replace => s.generation += 1,
                    Stop::Shutdown => {}
                }
            }
            let was_ready = self.ready_once.load(std::sync::atomic::Ordering::Relaxed);
            ever_ready |= was_ready;
            match stop {
                Stop::Died(log, why) => {
                    if !ever_ready {
                        unready_deaths += 1;
                        if unready_deaths >= NEVER_READY_STARTS {
                            return Err(NeverReady {
                                replica: self.id.clone(),
                                why,
                                log_tail: self.log_tail(&launcher.args, log, logged_before),
                            });
                        }
                        // Quietly: a refused setting is reported once, on giving up.
                        tracing::debug!(replica = %self.id, %why, "died before it was ready; starting it again");
                    } else {
                        if started.elapsed() > STAYED_UP {
                            backoff = RESTART_FIRST;
                        }
                        eprintln!(
                            "baton dev: {} died: {why}; restarting in {} ms",
                            self.id,
                            backoff.as_millis()
                        );
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RESTART_CAP);
                }
                Stop::Replace => {}
                Stop::Shutdown => return Ok(()),
            }
        }
    }
}

/// A replica's running processes and where they listen.
struct Started {
    agent: Child,
    sidecar: Child,
    agent_url: String,
    /// `None` when the sidecar exited before it listened.
    url: Option<String>,
}

/// How long a process may take to bind and say where.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

fn with_common(cmd: &mut Command, log: std::fs::File) -> std::io::Result<&mut Command> {
    Ok(cmd
        // Children exit if `baton dev` dies without stopping them.
        .env("BATON_EXIT_WITH_PARENT", "1")
        .stdin(Stdio::null())
        // Standard output is read for the address the process bound
        // (then copied to its log); its log lines go to standard error.
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(true))
}

/// The first `http://` URL `child` prints on its standard output (the
/// address it bound); every line is copied to `log`, the rest as it comes.
async fn printed_url(child: &mut Child, log: std::fs::File, what: &str) -> std::io::Result<String> {
    use std::io::Write as _;
    use tokio::io::AsyncBufReadExt as _;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no standard output"))?;
    let (found, url) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut log = log;
        let mut found = Some(found);
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = writeln!(log, "{line}");
            if let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://"))
                && let Some(found) = found.take()
            {
                let _ = found.send(url.to_owned());
            }
        }
    });
    match tokio::time::timeout(LISTEN_TIMEOUT, url).await {
        Ok(Ok(url)) => Ok(url),
        Ok(Err(_)) => Err(std::io::Error::other(format!(
            "{what} exited before it said where it listens"
        ))),
        Err(_) => Err(std::io::Error::other(format!(
            "{what} did not say where it listens within {LISTEN_TIMEOUT:?}"
        ))),
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    }
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// Stops both processes: the sidecar gets SIGTERM (it drains) and up to the
/// drain timeout when `graceful`; whatever still runs is killed.
async fn stop_processes(sidecar: &mut Child, agent: &mut Child, graceful: bool, drain: Duration) {
    if graceful {
        signal(sidecar, nix::sys::signal::Signal::SIGTERM);
        let grace = drain + Duration::from_secs(5);
        if tokio::time::timeout(grace, sidecar.wait()).await.is_err() {
            eprintln!("baton dev: a sidecar ignored SIGTERM for {grace:?}; killing it");
        }
    }
    let _ = sidecar.kill().await;
    let _ = agent.kill().await;
}
