//! Live `baton dev` clusters for the acceptance tests: real replica
//! processes (sidecar + reference agent), on the embedded stores or on real
//! Redis (one server, or a Redis Cluster of three masters with a replica
//! each) + Postgres + SeaweedFS started by the test itself.

pub mod browser;
pub mod sse;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton_testkit::{PostgresServer, RedisCluster, RedisServer, S3Server, free_port, poll_async};
use serde_json::{Value, json};

/// The acceptance tests run one at a time: each starts several processes,
/// and the machines have two cores.
/// An async mutex: each test has its own runtime, and the guard is held
/// across awaits.
pub static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}

pub use crate::baton;

/// Which stores a cluster runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// SQLite + a local directory: what `baton dev` uses by default.
    Embedded,
    /// Real Redis, Postgres and SeaweedFS (S3), each started for the test.
    Real,
    /// As `Real`, on a Redis Cluster of three masters with a replica each
    /// (`--redis-url redis+cluster://…`).
    RealCluster,
}

/// The Redis behind a cluster of real stores.
enum Redis {
    Server(RedisServer),
    Cluster(RedisCluster),
}

/// Servers behind a `Stores::Real` cluster; dropped with it.
struct RealStores {
    redis_url: String,
    _redis: Redis,
    _postgres: PostgresServer,
    _s3: S3Server,
    args: Vec<String>,
}

fn real_stores(cluster: bool) -> RealStores {
    let redis = if cluster {
        Redis::Cluster(RedisCluster::start(3, 1))
    } else {
        Redis::Server(RedisServer::start())
    };
    let redis_url = match &redis {
        Redis::Server(server) => server.url(),
        Redis::Cluster(cluster) => cluster.url(),
    };
    let postgres = PostgresServer::start();
    let database = postgres.create_database("baton");
    let s3 = S3Server::start("baton");
    let args = vec![
        format!("--redis-url={redis_url}"),
        format!("--database-url={database}"),
        format!("--s3-endpoint={}", s3.endpoint()),
        "--s3-bucket=baton".into(),
        format!("--s3-access-key-id={}", baton_testkit::S3_ACCESS_KEY_ID),
        format!(
            "--s3-secret-access-key={}",
            baton_testkit::S3_SECRET_ACCESS_KEY
        ),
    ];
    RealStores {
        redis_url,
        _redis: redis,
        _postgres: postgres,
        _s3: s3,
        args,
    }
}

/// A running `baton dev`; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Cluster {
    pub url: String,
    pub data_dir: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
    _stores: Option<RealStores>,
    pub http: reqwest::Client,
    /// A dashboard token for `baton dev`'s own routes (with a tokens file).
    token: Option<String>,
}

pub struct ClusterOptions {
    pub stores: Stores,
    pub replicas: usize,
    pub lease_ttl: &'static str,
    pub heartbeat_interval: &'static str,
    pub drain_timeout: &'static str,
    /// More flags for `baton dev`.
    pub extra_args: Vec<String>,
    /// More environment for `baton dev`.
    pub env: Vec<(String, String)>,
    /// A token of `--dashboard-tokens-file` (any role), when one is given:
    /// `baton dev`'s own routes (the replica list) need it.
    pub dashboard_token: Option<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            stores: Stores::Embedded,
            replicas: 2,
            lease_ttl: "30s",
            heartbeat_interval: "250ms",
            drain_timeout: "10s",
            extra_args: Vec::new(),
            env: Vec::new(),
            dashboard_token: None,
        }
    }
}

/// Sends `signal` (e.g. "KILL", "STOP", "CONT") to `pid`.
pub fn signal(pid: u64, signal: &str) {
    baton_testkit::send_signal(u32::try_from(pid).expect("a pid"), signal);
}

/// A long turn running on the first replica, which a test then stops.
pub struct HeldTurn {
    /// The client's answer, once the turn ends.
    pub answer: tokio::task::JoinHandle<(u16, Value)>,
    /// The lease holder id of the turn.
    pub holder: String,
    /// The first replica's sidecar process.
    pub pid: u64,
    /// The second replica's sidecar URL (never the front door, which could
    /// route to the stopped replica).
    pub other_url: String,
}

impl Cluster {
    /// Starts `/sleep <ms>` on `session` straight on the first replica's
    /// sidecar and waits until it holds the lease.
    pub async fn held_turn(&self, session: &str, ms: u64) -> HeldTurn {
        let replicas = self.replicas().await.expect("replica list");
        let url = replicas[0]["url"].as_str().unwrap().to_owned();
        let pid = replicas[0]["pid"].as_u64().unwrap();
        let other_url = replicas[1]["url"].as_str().unwrap().to_owned();
        let answer = {
            let (http, session) = (self.http.clone(), session.to_owned());
            tokio::spawn(async move {
                let r = http
                    .post(format!("{url}/v1/sessions/{session}/turns"))
                    .json(&json!({ "input": format!("/sleep {ms}") }))
                    .send()
                    .await
                    .unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            })
        };
        let holder = self.lease_owner(session).await;
        HeldTurn {
            answer,
            holder,
            pid,
            other_url,
        }
    }

    /// SIGSTOPs replica process `pid`; on the embedded stores, at a moment
    /// it holds no SQLite write lock (see `stop_outside_a_sqlite_write`).
    pub async fn pause(&self, pid: u64) {
        if self._stores.is_some() {
            signal(pid, "STOP");
        } else {
            let pid = u32::try_from(pid).expect("a pid");
            baton_testkit::stop_outside_a_sqlite_write(pid, &self.data_dir.join("baton.db")).await;
        }
    }

    /// The Redis of a `Stores::Real` cluster.
    pub fn redis_url(&self) -> Option<&str> {
        self._stores.as_ref().map(|s| s.redis_url.as_str())
    }

    pub async fn start(stores: Stores) -> Self {
        Self::start_with(ClusterOptions {
            stores,
            ..ClusterOptions::default()
        })
        .await
    }

    pub async fn start_with(options: ClusterOptions) -> Self {
        let real = match options.stores {
            Stores::Embedded => None,
            Stores::Real => Some(real_stores(false)),
            Stores::RealCluster => Some(real_stores(true)),
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("dev.log")).expect("log file");
        let mut cmd = Command::new(baton());
        cmd.arg("dev")
            .arg(format!("--listen=127.0.0.1:{port}"))
            .arg(format!("--replicas={}", options.replicas))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg(format!("--lease-ttl={}", options.lease_ttl))
            .arg(format!(
                "--heartbeat-interval={}",
                options.heartbeat_interval
            ))
            .arg(format!("--drain-timeout={}", options.drain_timeout))
            .args(&options.extra_args)
            .envs(options.env.iter().map(|(k, v)| (k, v)));
        if let Some(real) = &real {
            cmd.args(&real.args);
            // The replicas inherit it: on real stores every sidecar runs two
            // runtime threads, each with its own Redis connection, so the
            // kill, pause, takeover and rollout tests cover that layout
            // too (the embedded runs keep the default, one).
            cmd.env("BATON_WORKER_THREADS", "2");
        }
        let child = cmd
            .env("BATON_EXIT_WITH_PARENT", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("baton dev starts");
        let cluster = Self {
            url: format!("http://127.0.0.1:{port}"),
            data_dir: dir.path().join("data"),
            child,
            _dir: dir,
            _stores: real,
            http: reqwest::Client::new(),
            token: options.dashboard_token,
        };
        cluster.wait_ready().await;
        cluster
    }

    /// Waits until every replica is ready.
    pub async fn wait_ready(&self) {
        poll_async(Duration::from_secs(60), "every replica ready", || async {
            let replicas = self.replicas().await.ok()?;
            replicas
                .iter()
                .all(|r| r["ready"] == json!(true))
                .then_some(())
        })
        .await;
    }

    pub async fn replicas(&self) -> Result<Vec<Value>, reqwest::Error> {
        let mut request = self.http.get(format!("{}/v1/dev/replicas", self.url));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request.send().await?.json().await
    }

    pub async fn replica(&self, id: &str) -> Value {
        self.replicas()
            .await
            .expect("replica list")
            .into_iter()
            .find(|r| r["id"] == json!(id))
            .unwrap_or_else(|| panic!("no replica {id}"))
    }

    /// `POST /api/chat` through the front door: (HTTP status, body).
    pub async fn chat(&self, session: &str, input: &str) -> (u16, Value) {
        self.post(
            &format!("{}/api/chat", self.url),
            &json!({ "sessionId": session, "input": input }),
        )
        .await
    }

    /// `POST /v1/sessions/{session}/turns` on `base` (front door or a replica).
    pub async fn turn_on(
        &self,
        base: &str,
        session: &str,
        body: &Value,
        query: &str,
    ) -> (u16, Value) {
        self.post(&format!("{base}/v1/sessions/{session}/turns{query}"), body)
            .await
    }

    pub async fn post(&self, url: &str, body: &Value) -> (u16, Value) {
        let answer = self
            .http
            .post(url)
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// `GET /v1/sessions/{session}?state=true`.
    pub async fn session(&self, session: &str) -> Value {
        self.http
            .get(format!("{}/v1/sessions/{session}?state=true", self.url))
            .send()
            .await
            .expect("session view")
            .json()
            .await
            .expect("session JSON")
    }

    pub async fn file(&self, session: &str, name: &str) -> (u16, String) {
        let answer = self
            .http
            .get(format!("{}/v1/sessions/{session}/files/{name}", self.url))
            .send()
            .await
            .expect("file download");
        (
            answer.status().as_u16(),
            answer.text().await.unwrap_or_default(),
        )
    }

    /// Waits until `session` has a lease; returns its owner (a holder id,
    /// `<replica>-<suffix>`).
    pub async fn lease_owner(&self, session: &str) -> String {
        poll_async(
            Duration::from_secs(10),
            "the turn to hold a lease",
            || async {
                let view = self.session(session).await;
                view["lease"]["owner"].as_str().map(str::to_owned)
            },
        )
        .await
    }

    /// The replica (id, sidecar URL, pid) whose process holds `holder`.
    pub async fn replica_of(&self, holder: &str) -> (String, String, u64) {
        let replicas = self.replicas().await.expect("replica list");
        let r = replicas
            .iter()
            .find(|r| {
                holder
                    .strip_prefix(r["id"].as_str().unwrap_or("?"))
                    .is_some_and(|rest| rest.starts_with('-'))
            })
            .unwrap_or_else(|| panic!("no replica holds {holder}"));
        (
            r["id"].as_str().unwrap().to_owned(),
            r["url"].as_str().unwrap().to_owned(),
            r["pid"].as_u64().expect("replica runs"),
        )
    }

    /// Turns the agents of every replica ran (their `/v1/stats`).
    pub async fn agent_turns_run(&self) -> u64 {
        let mut total = 0;
        for r in self.replicas().await.expect("replica list") {
            let stats: Value = self
                .http
                .get(format!("{}/v1/stats", r["agentUrl"].as_str().unwrap()))
                .send()
                .await
                .expect("agent stats")
                .json()
                .await
                .expect("stats JSON");
            total += stats["turnsRun"].as_u64().unwrap();
        }
        total
    }

    /// Runs `baton bench` against the front door and returns its JSON report.
    pub fn bench(&self, extra: &[&str]) -> std::process::Child {
        Command::new(baton())
            .arg("bench")
            .arg(format!("--url={}", self.url))
            .arg("--json")
            .args(extra)
            .env("BATON_EXIT_WITH_PARENT", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("baton bench starts")
    }

    pub fn rollout(&self) -> std::process::Output {
        Command::new(baton())
            .args(["dev", "rollout", "--url", &self.url])
            .output()
            .expect("baton dev rollout runs")
    }

    /// The `baton dev` process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The dev log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("dev.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Milliseconds since `t`, for the figures the tests log.
pub fn ms_since(t: Instant) -> u128 {
    t.elapsed().as_millis()
}

/// Waits until the cluster's agents ran at least `n` turns.
pub async fn poll_turns(dev: &Cluster, n: u64) {
    poll_async(
        Duration::from_secs(30),
        "the load to reach the replicas",
        || async { (dev.agent_turns_run().await >= n).then_some(()) },
    )
    .await;
}

/// One sidecar and its reference agent, started directly (no `baton dev`),
/// on the embedded stores; killed when dropped.
pub struct Replica {
    pub url: String,
    /// The admin listener's URL, when started with `--admin-listen`.
    pub admin_url: Option<String>,
    sidecar: Child,
    agent: Child,
    _dir: tempfile::TempDir,
}

fn listening_url(child: &mut Child, what: &str) -> String {
    listening_urls(child, what, 1).remove(0)
}

/// The URLs printed on the first `count` lines of `child`'s output.
fn listening_urls(child: &mut Child, what: &str, count: usize) -> Vec<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut reader = std::io::BufReader::new(stdout);
    (0..count)
        .map(|_| {
            let mut line = String::new();
            reader
                .read_line(&mut line)
                .unwrap_or_else(|e| panic!("{what} output: {e}"));
            line.split_whitespace()
                .find(|w| w.starts_with("http://"))
                .unwrap_or_else(|| panic!("{what} did not print its address: {line:?}"))
                .to_owned()
        })
        .collect()
}

impl Replica {
    /// Where this replica's sidecar keeps session workspaces.
    pub fn workspace(&self) -> PathBuf {
        self._dir.path().join("workspace")
    }

    /// Sends the sidecar SIGTERM, as the kubelet does.
    pub fn terminate(&self) {
        signal(u64::from(self.sidecar.id()), "TERM");
    }

    /// Waits for the sidecar to exit, at most `timeout`.
    pub async fn exit_status(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let sidecar = &mut self.sidecar;
        poll_async(timeout, "the sidecar to exit", || {
            let status = sidecar.try_wait().expect("sidecar status");
            async move { status }
        })
        .await
    }

    /// Starts a replica and waits until it is ready.
    pub async fn start(extra: &[&str]) -> Self {
        Self::start_until(extra, "/readyz").await
    }

    /// Starts a replica and waits until `probe` answers 200.
    pub async fn start_until(extra: &[&str], probe: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut agent = Command::new(baton())
            .args(["agent", "--listen=127.0.0.1:0"])
            .env("BATON_EXIT_WITH_PARENT", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts");
        let agent_url = listening_url(&mut agent, "agent");
        let mut sidecar = Command::new(baton())
            .arg("sidecar")
            .arg("--replica-id=solo")
            .args(
                (!extra.iter().any(|a| a.starts_with("--listen")))
                    .then_some("--listen=127.0.0.1:0"),
            )
            .args(
                (!extra.iter().any(|a| a.starts_with("--agent-url")))
                    .then(|| format!("--agent-url={agent_url}")),
            )
            .arg("--sqlite-path")
            .arg(dir.path().join("baton.db"))
            .arg("--objects-dir")
            .arg(dir.path().join("objects"))
            .arg("--workspace-dir")
            .arg(dir.path().join("workspace"))
            .args(extra)
            .env("BATON_EXIT_WITH_PARENT", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sidecar starts");
        let admin = extra.iter().any(|a| a.starts_with("--admin-listen"));
        let mut urls = listening_urls(&mut sidecar, "sidecar", 1 + usize::from(admin));
        let admin_url = admin.then(|| urls.remove(1));
        let replica = Self {
            url: urls.remove(0),
            admin_url,
            sidecar,
            agent,
            _dir: dir,
        };
        let http = reqwest::Client::new();
        poll_async(Duration::from_secs(30), "the sidecar ready", || async {
            let r = http
                .get(format!("{}{probe}", replica.url))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        replica
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.sidecar.kill();
        let _ = self.agent.kill();
        let _ = self.sidecar.wait();
        let _ = self.agent.wait();
    }
}
