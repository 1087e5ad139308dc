//! Test helpers: real servers on free loopback ports, started by the tests
//! themselves and stopped when dropped, and waiting on conditions instead of
//! sleeping.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Polls `condition` until it holds or `timeout` passes; panics with `what` then.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A private `redis-server` (Debian package) on a free port, no persistence
/// unless asked. Killed when dropped.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    appendonly: bool,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// With AOF persistence (`appendfsync everysec`), as the chart runs it.
    pub fn start_with(appendonly: bool) -> Self {
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            appendonly,
        };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", if self.appendonly { "yes" } else { "no" }])
            .args(["--appendfsync", "everysec"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (apt-get install redis-server)");
        self.child = Some(child);
        let port = self.port;
        wait_until(
            Duration::from_secs(10),
            "redis-server to answer PING",
            || redis_ping(port),
        );
    }

    /// Kills the server (SIGKILL) and starts it again on the same port: with
    /// no persistence it comes back empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server and leaves it down.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn redis_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// Async form of [`wait_until`], for conditions that query a store.
pub async fn wait_until_async<F, Fut>(timeout: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
