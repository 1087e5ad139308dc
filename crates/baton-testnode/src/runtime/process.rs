//! Starting and signalling container processes. Every process is started
//! as `ip netns exec <pod's namespace> [setpriv …] program args` (which
//! execs the program, so the pid we hold is the program's), in a process
//! group of its own, with stdout and stderr appended to the container's log
//! file.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::launch::Launch;

/// iproute2's `ip`, by absolute path: the child's PATH is the container's.
pub(crate) fn ip_binary() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

/// `setpriv` arguments that switch to `user` (and its groups) and exec.
pub(crate) fn setpriv_args(user: &str) -> Vec<String> {
    vec![
        format!("--reuid={user}"),
        format!("--regid={user}"),
        "--init-groups".into(),
        "--".into(),
    ]
}

/// stdout and stderr handles appending to `log`.
pub(crate) fn log_stdio(log: &Path) -> std::io::Result<(Stdio, Stdio)> {
    let file = OpenOptions::new().create(true).append(true).open(log)?;
    Ok((Stdio::from(file.try_clone()?), Stdio::from(file)))
}

/// Appends a line of the node's own to the container log (start, exit).
pub(crate) fn log_line(log: &Path, line: &str) {
    if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(file, "[testnode {}] {line}", jiff_now());
    }
}

fn jiff_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Millisecond)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Mounts each `host container` pair given as arguments up to `--`, then
/// execs the rest.
const BIND_AND_EXEC: &str = r#"while [ "$1" != -- ]; do mkdir -p "$2" && mount --bind "$1" "$2" || exit 126; shift 2; done; shift; exec "$@""#;

/// A command that runs `launch` inside network namespace `netns`, or
/// `None` for the host's namespace.
pub(crate) fn command(launch: &Launch, netns: Option<&str>) -> tokio::process::Command {
    let mut argv: Vec<String> = Vec::new();
    if netns.is_some() && !launch.bind_mounts.is_empty() {
        // `ip netns exec` gives the process a mount namespace of its own:
        // bind mounts made there stay private to it. The shell execs, so
        // the pid is still the program's.
        argv.extend([
            "/bin/sh".into(),
            "-c".into(),
            BIND_AND_EXEC.into(),
            "sh".into(),
        ]);
        for (host, container) in &launch.bind_mounts {
            argv.push(host.display().to_string());
            argv.push(container.clone());
        }
        argv.push("--".into());
    }
    if let Some(user) = &launch.user {
        argv.push("setpriv".into());
        argv.extend(setpriv_args(user));
    }
    argv.push(launch.program.clone());
    argv.extend(launch.args.iter().cloned());
    let mut cmd = match netns {
        Some(ns) => {
            let mut cmd = tokio::process::Command::new(ip_binary());
            cmd.args(["netns", "exec", ns]).args(&argv);
            cmd
        }
        None => {
            let mut cmd = tokio::process::Command::new(&argv[0]);
            cmd.args(&argv[1..]);
            cmd
        }
    };
    cmd.env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.cwd)
        .stdin(Stdio::null());
    cmd
}

/// Starts a container's main process.
pub(crate) fn spawn(
    launch: &Launch,
    netns: &str,
    log: &Path,
) -> std::io::Result<tokio::process::Child> {
    std::fs::create_dir_all(&launch.cwd)?;
    if let Some(tmp) = launch.env.iter().find(|(k, _)| k == "TMPDIR") {
        std::fs::create_dir_all(&tmp.1)?;
    }
    let (out, err) = log_stdio(log)?;
    log_line(
        log,
        &format!("exec {} {}", launch.program, launch.args.join(" ")),
    );
    command(launch, Some(netns))
        .stdout(out)
        .stderr(err)
        // Its own group: a kill reaches the process's children too, and
        // a Ctrl-C of the test does not reach the pods (the exit watcher
        // cleans them up).
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
}

/// Sends `signal` to process `pid`.
pub(crate) fn signal(pid: u32, signal: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), signal);
}

/// SIGKILLs the process group led by `pid` (what is left of a container).
pub(crate) fn kill_group(pid: u32) {
    let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
}
