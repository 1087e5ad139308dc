//! One container's life on the node: build its launch, start the process,
//! run its startup, readiness and liveness probes, restart it per the
//! pod's restartPolicy with a short back-off, and stop it (preStop hook,
//! SIGTERM, SIGKILL at the deadline) when the pod goes away.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use k8s_openapi::jiff::Timestamp;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

use super::launch::{self, Launch, LaunchContext};
use super::process;
use super::state::{Current, PodShared, Slot, Termination};
use crate::env::{self, PodFacts, Sources};
use crate::images::Runner;
use crate::network::Sandbox;
use crate::node::NodeCtx;
use crate::paths::MountTable;
use crate::probes::{self, Action, ProbeTarget};
use crate::volumes::PodDirs;

/// A request to stop: SIGKILL at `deadline`, after the preStop hook and
/// SIGTERM when `graceful`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stop {
    pub deadline: Instant,
    pub graceful: bool,
}

/// First restart delay; it doubles per restart up to
/// [`crate::NodeConfig::max_restart_backoff`], and starts over after a run
/// of ten seconds or more.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const STABLE_RUN: Duration = Duration::from_secs(10);

pub(crate) struct ContainerTask {
    pub node: Arc<NodeCtx>,
    pub pod: Arc<Pod>,
    pub shared: Arc<PodShared>,
    pub slot: Slot,
    pub spec: Container,
    pub sandbox: Sandbox,
    pub dirs: PodDirs,
    pub volumes: Arc<HashMap<String, PathBuf>>,
    pub stop: watch::Receiver<Option<Stop>>,
}

enum Prepared {
    Ready(Box<(Runner, Launch)>),
    /// The image is not in the table: like a pull that always fails.
    ImagePull(String),
    /// A Secret or ConfigMap is missing, say: retried.
    Config(String),
}

enum Outcome {
    Exited(std::process::ExitStatus),
    ProbeFailed(String),
    Stopped(Stop),
}

impl ContainerTask {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn log(&self) -> PathBuf {
        self.dirs.log(self.name())
    }

    fn stop_requested(&self) -> Option<Stop> {
        *self.stop.borrow()
    }

    fn restart_policy(&self) -> &str {
        let policy = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always");
        // An init container must finish: it is retried on failure unless
        // the pod never restarts anything.
        match (self.slot.init, policy) {
            (true, "Never") => "Never",
            (true, _) => "OnFailure",
            (false, policy) => policy,
        }
    }

    fn grace_period(&self) -> Duration {
        let seconds = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        Duration::from_secs(seconds.max(0) as u64)
    }

    fn set_waiting(&self, reason: &str, message: Option<String>) {
        self.shared.update_container(self.slot, |c| {
            c.current = Current::Waiting {
                reason: reason.into(),
                message,
            };
            c.ready = false;
            c.pid = None;
        });
    }

    /// Sleeps for `d` unless a stop comes first; `true` when stopped.
    async fn sleep_or_stop(&mut self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => self.stop_requested().is_some(),
            _ = wait_for_stop(&mut self.stop) => true,
        }
    }

    pub async fn run(mut self) {
        let mut backoff = FIRST_BACKOFF;
        loop {
            if self.stop_requested().is_some() {
                self.finish_without_running();
                return;
            }
            let (runner, launch) = match self.prepare().await {
                Prepared::Ready(ready) => *ready,
                Prepared::ImagePull(message) => {
                    self.set_waiting("ErrImagePull", Some(message));
                    wait_for_stop(&mut self.stop).await;
                    self.finish_without_running();
                    return;
                }
                Prepared::Config(message) => {
                    tracing::debug!(container = self.name(), "{message}");
                    self.set_waiting("CreateContainerConfigError", Some(message));
                    if self.sleep_or_stop(Duration::from_secs(1)).await {
                        self.finish_without_running();
                        return;
                    }
                    continue;
                }
            };
            let started_at = Timestamp::now();
            let started = Instant::now();
            let (termination, stopped) = match self.start(&launch).await {
                Err(message) => {
                    process::log_line(&self.log(), &format!("start failed: {message}"));
                    let t = Termination {
                        exit_code: 128,
                        signal: None,
                        reason: "StartError".into(),
                        message: Some(message),
                        started_at: None,
                        finished_at: Timestamp::now(),
                        container_id: None,
                    };
                    (t, self.stop_requested().is_some())
                }
                Ok(mut child) => self.supervise(&mut child, runner, launch, started_at).await,
            };
            let restart = !stopped
                && match self.restart_policy() {
                    "Never" => false,
                    "OnFailure" => termination.exit_code != 0,
                    _ => true,
                };
            self.shared.update_container(self.slot, |c| {
                c.ready = false;
                c.started = false;
                c.pid = None;
                if restart {
                    c.last = Some(termination.clone());
                    c.current = Current::Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: Some(format!(
                            "back-off {backoff:?} restarting failed container={}",
                            c.name
                        )),
                    };
                } else {
                    c.current = Current::Terminated(termination.clone());
                    c.done = true;
                }
            });
            if !restart {
                return;
            }
            if started.elapsed() >= STABLE_RUN {
                backoff = FIRST_BACKOFF;
            }
            if self.sleep_or_stop(backoff).await {
                self.shared.update_container(self.slot, |c| {
                    if let Some(last) = c.last.take() {
                        c.current = Current::Terminated(last);
                    }
                    c.done = true;
                });
                return;
            }
            backoff = (backoff * 2).min(self.node.config.max_restart_backoff);
            self.shared
                .update_container(self.slot, |c| c.restart_count += 1);
        }
    }

    /// A container stopped before it ever ran ends Terminated, so the pod
    /// status shows it finished.
    fn finish_without_running(&self) {
        self.shared.update_container(self.slot, |c| {
            if !matches!(c.current, Current::Terminated(_)) {
                c.current = Current::Terminated(Termination {
                    exit_code: 0,
                    signal: None,
                    reason: "ContainerStatusUnknown".into(),
                    message: Some("the pod was stopped before the container started".into()),
                    started_at: None,
                    finished_at: Timestamp::now(),
                    container_id: None,
                });
            }
            c.ready = false;
            c.pid = None;
            c.done = true;
        });
    }

    async fn prepare(&self) -> Prepared {
        let image = self.spec.image.clone().unwrap_or_default();
        let Some(runner) = self.node.config.images.lookup(&image).cloned() else {
            return Prepared::ImagePull(format!(
                "Failed to pull image {image:?}: the test node's image table has no entry for {:?}",
                crate::images::repository(&image)
            ));
        };
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
        let facts = PodFacts {
            pod: &self.pod,
            pod_ip: Some(self.sandbox.ip),
            host_ip: self.node.net.host_ip(),
        };
        let mut sources = Sources::new(self.node.client.clone(), &namespace);
        let mut resolved = match env::resolve(&self.spec, &facts, &mut sources).await {
            Ok(env) => env,
            Err(e) => return Prepared::Config(e.0),
        };
        if let Some(port) = self.node.api_port {
            // A kubelet always sets the API server's Service variables,
            // before the container's own (which win).
            let service = [
                ("KUBERNETES_SERVICE_HOST", crate::api_proxy::HOST.to_owned()),
                ("KUBERNETES_SERVICE_PORT", port.to_string()),
                ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
            ];
            for (key, value) in service {
                if !resolved.iter().any(|(k, _)| k == key) {
                    resolved.insert(0, (key.to_owned(), value));
                }
            }
        }
        let mut mounts = Vec::new();
        for m in self.spec.volume_mounts.iter().flatten() {
            let Some(dir) = self.volumes.get(&m.name) else {
                return Prepared::Config(format!("volume {:?} is not defined in the pod", m.name));
            };
            let dir = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => {
                    let dir = dir.join(sub);
                    let _ = crate::volumes::create_open_dir(&dir);
                    dir
                }
                None => dir.clone(),
            };
            mounts.push((m.mount_path.clone(), dir));
        }
        let mounts = MountTable::new(mounts);
        let hostname = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.clone())
            .or_else(|| self.pod.metadata.name.clone())
            .unwrap_or_default();
        let container_dir = self.dirs.container(self.name());
        let socket_dir = self.sandbox.run_dir().join(self.name());
        if let Err(e) = std::fs::create_dir_all(&socket_dir) {
            return Prepared::Config(format!("creating {}: {e}", socket_dir.display()));
        }
        match launch::build(LaunchContext {
            runner: &runner,
            container: &self.spec,
            env: resolved,
            mounts: &mounts,
            container_dir: &container_dir,
            socket_dir: &socket_dir,
            hostname: &hostname,
            pod_ip: self.sandbox.ip,
        }) {
            Ok(launch) => Prepared::Ready(Box::new((runner, launch))),
            Err(e) => Prepared::Config(e),
        }
    }

    async fn start(&self, launch: &Launch) -> Result<tokio::process::Child, String> {
        let log = self.log();
        if let Some(setup) = &launch.setup {
            std::fs::create_dir_all(&launch.cwd).map_err(|e| e.to_string())?;
            launch::run_setup(setup, &log).await?;
        }
        if self.node.is_shutting_down() || self.stop_requested().is_some() {
            return Err("the pod is stopping".into());
        }
        process::spawn(launch, &self.sandbox.netns, &log)
            .map_err(|e| format!("starting {}: {e}", launch.program))
    }

    /// Runs a started process until it exits, a probe gives up on it or
    /// the pod stops it. Returns its termination and whether it was
    /// stopped on purpose.
    async fn supervise(
        &mut self,
        child: &mut tokio::process::Child,
        runner: Runner,
        launch: Launch,
        started_at: Timestamp,
    ) -> (Termination, bool) {
        let pid = child.id().unwrap_or_default();
        let container_id = format!(
            "testnode://{}/{}/{}",
            self.pod.metadata.uid.as_deref().unwrap_or_default(),
            self.name(),
            pid
        );
        let has_startup = self.spec.startup_probe.is_some();
        let has_readiness = self.spec.readiness_probe.is_some();
        self.shared.update_container(self.slot, |c| {
            c.current = Current::Running { started_at };
            c.pid = Some(pid);
            c.container_id = Some(container_id.clone());
            c.image_id = format!("testnode://{}", launch.program);
            c.started = !has_startup;
            c.ready = !has_startup && !has_readiness;
        });
        let target = ProbeTarget {
            pod_ip: self.sandbox.ip,
            netns: self.sandbox.netns.clone(),
            ports: self.spec.ports.clone().unwrap_or_default(),
            launch,
            runner,
            http: self.node.http.clone(),
        };
        let outcome = {
            let probing = self.probe_until_failure(&target);
            let stop = wait_for_stop_value(self.stop.clone());
            tokio::select! {
                status = child.wait() => match status {
                    Ok(status) => Outcome::Exited(status),
                    Err(e) => Outcome::ProbeFailed(format!("waiting for the process: {e}")),
                },
                message = probing => Outcome::ProbeFailed(message),
                stop = stop => Outcome::Stopped(stop),
            }
        };
        let (status, message, stopped) = match outcome {
            Outcome::Exited(status) => (status, None, false),
            Outcome::ProbeFailed(message) => {
                tracing::info!(container = self.name(), "{message}; restarting");
                process::log_line(&self.log(), &format!("{message}; killing the container"));
                let deadline = Instant::now() + self.grace_period();
                let status = terminate(child, pid, deadline).await;
                (status, Some(message), false)
            }
            Outcome::Stopped(stop) => {
                let status = self.stop_gracefully(child, pid, &target, stop).await;
                (status, None, true)
            }
        };
        // Whatever the process left behind goes with it, as with a
        // container's cgroup.
        process::kill_group(pid);
        let signal = status.signal();
        let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
        process::log_line(&self.log(), &format!("exited: {status}"));
        let termination = Termination {
            exit_code,
            signal,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            message,
            started_at: Some(started_at),
            finished_at: Timestamp::now(),
            container_id: Some(container_id),
        };
        (termination, stopped)
    }

    /// preStop hook (bounded by the deadline), SIGTERM, SIGKILL at the
    /// deadline; a stop that is not graceful kills at once.
    async fn stop_gracefully(
        &self,
        child: &mut tokio::process::Child,
        pid: u32,
        target: &ProbeTarget,
        stop: Stop,
    ) -> std::process::ExitStatus {
        if !stop.graceful {
            process::kill_group(pid);
            return child.wait().await.unwrap_or_default();
        }
        let mut deadline = stop.deadline;
        if let Some(handler) = self
            .spec
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            && let Some(action) = Action::of_handler(handler)
        {
            let budget = deadline.saturating_duration_since(Instant::now());
            process::log_line(&self.log(), "running the preStop hook");
            let hook = probes::run(target, &action, budget);
            tokio::select! {
                result = hook => {
                    if let Err(e) = result {
                        process::log_line(&self.log(), &format!("preStop hook failed: {e}"));
                    }
                }
                status = child.wait() => return status.unwrap_or_default(),
            }
            // Like the kubelet: a hook that used up the grace period still
            // leaves the process two seconds between SIGTERM and SIGKILL.
            deadline = deadline.max(Instant::now() + Duration::from_secs(2));
        }
        terminate(child, pid, deadline).await
    }

    /// Startup probe until it succeeds, then liveness and readiness;
    /// returns only when the container must be restarted.
    async fn probe_until_failure(&self, target: &ProbeTarget) -> String {
        if let Some(probe) = &self.spec.startup_probe {
            let mut runner = ProbeRunner::new(probe, self.node.config.probe_period_cap);
            if let Err(message) = runner.until_success(target).await {
                return format!("Startup probe failed: {message}");
            }
            self.shared.update_container(self.slot, |c| {
                c.started = true;
                c.ready = self.spec.readiness_probe.is_none();
            });
        }
        let readiness = async {
            let Some(probe) = &self.spec.readiness_probe else {
                return std::future::pending::<()>().await;
            };
            let mut runner = ProbeRunner::new(probe, self.node.config.probe_period_cap);
            runner.initial_delay().await;
            let mut ready = false;
            loop {
                if let Some(now_ready) = runner.step(target).await
                    && now_ready != ready
                {
                    ready = now_ready;
                    self.shared.update_container(self.slot, |c| c.ready = ready);
                }
                runner.wait_period().await;
            }
        };
        let liveness = async {
            let Some(probe) = &self.spec.liveness_probe else {
                return std::future::pending::<String>().await;
            };
            let mut runner = ProbeRunner::new(probe, self.node.config.probe_period_cap);
            runner.initial_delay().await;
            loop {
                if runner.step(target).await == Some(false) {
                    return format!("Liveness probe failed: {}", runner.last_error);
                }
                runner.wait_period().await;
            }
        };
        tokio::select! {
            () = readiness => String::from("the readiness prober stopped"),
            message = liveness => message,
        }
    }
}

/// SIGTERM, then SIGKILL to the group at `deadline`.
async fn terminate(
    child: &mut tokio::process::Child,
    pid: u32,
    deadline: Instant,
) -> std::process::ExitStatus {
    process::signal(pid, Signal::SIGTERM);
    tokio::select! {
        status = child.wait() => return status.unwrap_or_default(),
        _ = tokio::time::sleep_until(deadline) => {}
    }
    process::kill_group(pid);
    child.wait().await.unwrap_or_default()
}

async fn wait_for_stop(stop: &mut watch::Receiver<Option<Stop>>) {
    let _ = stop.wait_for(Option::is_some).await;
}

async fn wait_for_stop_value(mut stop: watch::Receiver<Option<Stop>>) -> Stop {
    let requested = match stop.wait_for(Option::is_some).await {
        Ok(value) => *value,
        Err(_) => None,
    };
    // Without a request the pod worker is gone: stop at once.
    requested.unwrap_or_else(|| Stop {
        deadline: Instant::now(),
        graceful: false,
    })
}

/// One probe's schedule and thresholds.
struct ProbeRunner<'a> {
    probe: &'a Probe,
    period: Duration,
    timeout: Duration,
    successes: i32,
    failures: i32,
    last_error: String,
}

impl<'a> ProbeRunner<'a> {
    fn new(probe: &'a Probe, cap: Option<Duration>) -> Self {
        let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
        Self {
            probe,
            period: cap.map_or(period, |cap| period.min(cap)),
            timeout: Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64),
            successes: 0,
            failures: 0,
            last_error: String::new(),
        }
    }

    async fn initial_delay(&self) {
        let delay = self.probe.initial_delay_seconds.unwrap_or(0).max(0) as u64;
        tokio::time::sleep(Duration::from_secs(delay)).await;
    }

    async fn wait_period(&self) {
        tokio::time::sleep(self.period).await;
    }

    /// Runs the probe once; `Some(result)` once a threshold is reached.
    async fn step(&mut self, target: &ProbeTarget) -> Option<bool> {
        let result = match Action::of_probe(self.probe) {
            Some(action) => probes::run(target, &action, self.timeout).await,
            None => Err("probe without a supported action (grpc?)".into()),
        };
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes += 1;
                (self.successes >= self.probe.success_threshold.unwrap_or(1).max(1)).then_some(true)
            }
            Err(e) => {
                self.last_error = e;
                self.successes = 0;
                self.failures += 1;
                (self.failures >= self.probe.failure_threshold.unwrap_or(3).max(1)).then_some(false)
            }
        }
    }

    /// For a startup probe: Ok once it succeeds, Err after
    /// failureThreshold failures in a row.
    async fn until_success(&mut self, target: &ProbeTarget) -> Result<(), String> {
        self.initial_delay().await;
        loop {
            // A startup probe's successThreshold is always 1.
            self.successes = 0;
            match self.step(target).await {
                Some(true) => return Ok(()),
                Some(false) => return Err(self.last_error.clone()),
                None if self.successes > 0 => return Ok(()),
                None => {}
            }
            self.wait_period().await;
        }
    }
}
