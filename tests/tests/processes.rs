//! Guarantees with real processes: replicas (`baton-turn-worker`) are
//! killed with SIGKILL, paused with SIGSTOP and raced, on Redis and on the
//! embedded SQLite store.
//!
//! The storm is parameterised by environment variables, so a long run is one
//! command away: `BATON_STORM_SECS=120 BATON_STORM_WORKERS=6
//! BATON_STORM_SEED=42 cargo test -p baton-e2e --test processes storm`.

use baton_session_contract::cases;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_session::*;
use baton_store_redis::RedisStore;
use baton_store_sqlite::SqliteStore;
use baton_testkit::{RedisServer, poll_async, wait_until, wait_until_async};
use baton_workspace::WorkspaceStore;
use bytes::Bytes;

/// One `baton-turn-worker` process and the lines it printed.
struct Worker {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// Reads the worker's stdout into `lines` until the pipe closes.
    reader: Option<std::thread::JoinHandle<()>>,
    killed: bool,
}

impl Worker {
    fn start(args: &[String]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_baton-turn-worker"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("worker starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (out, sink) = (child.stdout.take().unwrap(), lines.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            lines,
            reader: Some(reader),
            killed: false,
        }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn wait_for(&self, prefix: &str, timeout: Duration) -> String {
        let mut found = None;
        wait_until(
            timeout,
            &format!("a worker line starting {prefix:?}"),
            || {
                found = self.lines().into_iter().find(|l| l.starts_with(prefix));
                found.is_some()
            },
        );
        found.unwrap()
    }

    fn signal(&self, signal: &str) {
        baton_testkit::send_signal(self.child.id(), signal.trim_start_matches('-'));
    }

    fn kill(&mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
        self.killed = true;
        self.read_to_the_end();
    }

    /// Every line the dead worker printed, in `lines`: a line it wrote just
    /// before it died (an INTENT whose commit landed) may still be in the
    /// pipe when the process is gone. The pipe ends with the process.
    fn read_to_the_end(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.read_to_the_end();
    }
}

fn storm_key(session: &str) -> SessionKey {
    SessionKey::new("storm", session).unwrap()
}

async fn checker<S: TurnStore>(store: &S) -> ReplicaId {
    cases::replica(store, "checker").await
}

/// The session's payload, read through a lease that is released at once.
async fn payload<S: TurnStore>(store: &S, key: &SessionKey) -> (u64, String) {
    let me = checker(store).await;
    poll_async(
        Duration::from_secs(10),
        "the session lease to be free",
        || async {
            match store
                .begin(&cases::begin_req(key, &me, None))
                .await
                .unwrap()
            {
                BeginOutcome::Granted { lease, state } => {
                    store.abort(&lease).await.unwrap();
                    Some((
                        state.version,
                        String::from_utf8(state.payload.unwrap().to_vec()).unwrap(),
                    ))
                }
                _ => None,
            }
        },
    )
    .await
}

// --- G2: a killed replica's session is free within about a second ---

async fn killed_mid_turn_frees_the_session_fast<S: TurnStore>(store: S, store_arg: String) {
    let mut holder = Worker::start(&[
        store_arg,
        "replica=doomed".into(),
        "sessions=g2".into(),
        "turns=1".into(),
        "hold_ms=60000".into(),
        "lease_ttl_ms=30000".into(),
        "heartbeat_ms=100".into(),
    ]);
    holder.wait_for("GRANTED g2", Duration::from_secs(20));
    holder.kill();
    let killed_at = Instant::now();

    let me = checker(&store).await;
    let key = storm_key("g2");
    wait_until_async(
        Duration::from_secs(10),
        "another replica to get the session",
        || async {
            matches!(
                store
                    .begin(&cases::begin_req(&key, &me, None))
                    .await
                    .unwrap(),
                BeginOutcome::Granted { .. }
            )
        },
    )
    .await;
    let free_after = killed_at.elapsed();
    eprintln!("G2: session free {free_after:?} after kill -9 (lease TTL 30s, heartbeat 100ms)");
    assert!(
        free_after < Duration::from_secs(5),
        "took {free_after:?}; the lease TTL is 30 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_redis_killed_mid_turn_frees_the_session_fast() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    killed_mid_turn_frees_the_session_fast(store, format!("store={}", redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_sqlite_killed_mid_turn_frees_the_session_fast() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let store = SqliteStore::open(&db).await.unwrap();
    killed_mid_turn_frees_the_session_fast(store, format!("store=sqlite:{}", db.display())).await;
}

// --- G5: a paused holder can neither commit nor publish a manifest ---

async fn paused_holder_is_fenced_out<S: TurnStore>(
    store: S,
    store_arg: String,
    sqlite_db: Option<&std::path::Path>,
) {
    let files = tempfile::tempdir().unwrap();
    let workspaces = WorkspaceStore::local(files.path()).unwrap();
    let paused = Worker::start(&[
        store_arg,
        "replica=sleeper".into(),
        "sessions=g5".into(),
        "turns=1".into(),
        "hold_ms=1500".into(),
        "lease_ttl_ms=1000".into(),
        "heartbeat_ms=100".into(),
        format!("workspace={}", files.path().display()),
    ]);
    paused.wait_for("GRANTED g5", Duration::from_secs(20));
    match sqlite_db {
        Some(db) => baton_testkit::stop_outside_a_sqlite_write(paused.child.id(), db).await,
        None => paused.signal("-STOP"),
    }

    // Another replica takes the session once the paused one's lease lapses,
    // runs a turn with a file of its own and commits.
    let me = checker(&store).await;
    let key = storm_key("g5");
    let (lease, state) = poll_async(
        Duration::from_secs(10),
        "the paused replica's lease to lapse",
        || async {
            match store
                .begin(&cases::begin_req(&key, &me, None))
                .await
                .unwrap()
            {
                BeginOutcome::Granted { lease, state } => Some((lease, state)),
                _ => None,
            }
        },
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let base = workspaces
        .materialize(state.workspace.as_deref(), dir.path())
        .await
        .unwrap();
    std::fs::write(dir.path().join("log.txt"), "checker-1\n").unwrap();
    let mine = workspaces
        .snapshot(
            dir.path(),
            &base.manifest,
            &key,
            lease.version + 1,
            lease.fence,
        )
        .await
        .unwrap();
    let commit = CommitRequest {
        workspace: mine.clone(),
        payload: Bytes::from("checker-1"),
        ..cases::commit_req(&lease, "checker-1", "r")
    };
    assert_eq!(
        store.commit(&commit).await.unwrap(),
        CommitOutcome::Committed { version: 1 }
    );

    // The paused replica wakes up, uploads its manifest and tries to commit.
    paused.signal("-CONT");
    let rejected = paused.wait_for("REJECTED g5", Duration::from_secs(20));
    assert!(rejected.contains("LeaseLost"), "{rejected}");
    assert!(!paused.lines().iter().any(|l| l.starts_with("OK ")));

    assert_eq!(payload(&store, &key).await, (1, "checker-1".to_owned()));
    let view = store.session(&key).await.unwrap().unwrap();
    assert_eq!(
        view.workspace, mine,
        "the state references the winner's manifest"
    );
    let manifests = workspaces.list_manifests().await.unwrap();
    assert_eq!(
        manifests.len(),
        2,
        "the fenced-out turn wrote a manifest: {manifests:?}"
    );
    let live = HashSet::from([mine.unwrap()]);
    let report = workspaces.gc(&live, Duration::ZERO).await.unwrap();
    assert_eq!(
        report.manifests_deleted, 1,
        "the fenced-out manifest is collectable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_redis_paused_holder_is_fenced_out() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    paused_holder_is_fenced_out(store, format!("store={}", redis.url()), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_sqlite_paused_holder_is_fenced_out() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let store = SqliteStore::open(&db).await.unwrap();
    paused_holder_is_fenced_out(store, format!("store=sqlite:{}", db.display()), Some(&db)).await;
}

// --- the storm: linearizability under SIGKILL and SIGSTOP ---

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Checks each session's final state against what the workers printed:
/// every acknowledged turn sits at its version's position, no turn appears
/// twice, nothing appears that no worker was about to commit, and the list
/// is exactly as long as the version.
fn check_linearizable(finals: &HashMap<String, (u64, String)>, lines: &[String]) {
    let mut intents = HashSet::new();
    let mut acknowledged = Vec::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["INTENT", session, turn] => {
                intents.insert((session.to_string(), turn.to_string()));
            }
            ["OK", session, version, turn] => {
                acknowledged.push((
                    session.to_string(),
                    version.parse::<u64>().unwrap(),
                    turn.to_string(),
                ));
            }
            _ => {}
        }
    }
    for (session, (version, payload)) in finals {
        let turns: Vec<&str> = if payload.is_empty() {
            vec![]
        } else {
            payload.split(',').collect()
        };
        assert_eq!(
            turns.len() as u64,
            *version,
            "{session}: {} turns in the state at version {version}",
            turns.len()
        );
        let distinct: HashSet<_> = turns.iter().collect();
        assert_eq!(
            distinct.len(),
            turns.len(),
            "{session}: a turn was applied twice"
        );
        for turn in &turns {
            assert!(
                intents.contains(&(session.clone(), turn.to_string())),
                "{session}: {turn} was never attempted"
            );
        }
    }
    for (session, version, turn) in &acknowledged {
        let (_, payload) = &finals[session];
        let at = payload
            .split(',')
            .nth(usize::try_from(*version).unwrap() - 1);
        assert_eq!(
            at,
            Some(turn.as_str()),
            "{session}: acknowledged {turn} at v{version} is not there (lost or reordered)"
        );
    }
    assert!(!acknowledged.is_empty(), "the storm committed nothing");
}

async fn storm<S: TurnStore>(store: S, store_arg: String) {
    let seed = env_num("BATON_STORM_SEED", 7);
    let seconds = env_num("BATON_STORM_SECS", 6);
    let workers = env_num("BATON_STORM_WORKERS", 4);
    let sessions = ["s1", "s2", "s3"];
    eprintln!("storm: seed={seed} seconds={seconds} workers={workers}");
    let start = |n: u64| {
        Worker::start(&[
            store_arg.clone(),
            format!("replica=w{n}"),
            format!("sessions={}", sessions.join(",")),
            "turns=1000000".into(),
            format!("seed={}", seed * 1000 + n),
            "hold_max_ms=15".into(),
            "lease_ttl_ms=600".into(),
            "heartbeat_ms=50".into(),
        ])
    };
    let mut running: Vec<Worker> = (0..workers).map(start).collect();
    let mut finished: Vec<Worker> = Vec::new();
    let mut next_id = workers;
    let mut rng = seed.max(1);
    let mut roll = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut kills, mut pauses) = (0, 0);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50 + roll() % 150)).await;
        let victim = usize::try_from(roll() % running.len() as u64).unwrap();
        // Strike mid-turn, while the victim holds a lease: that is where
        // fencing matters.
        let holding = |w: &Worker| w.lines().last().is_some_and(|l| l.starts_with("GRANTED"));
        let strike_by = Instant::now() + Duration::from_millis(200);
        while !holding(&running[victim]) && Instant::now() < strike_by {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if roll() % 3 == 0 {
            let mut dead = running.remove(victim);
            dead.kill();
            finished.push(dead);
            running.push(start(next_id));
            next_id += 1;
            kills += 1;
        } else {
            running[victim].signal("-STOP");
            tokio::time::sleep(Duration::from_millis(200 + roll() % 600)).await;
            running[victim].signal("-CONT");
            pauses += 1;
        }
    }
    for mut worker in running {
        worker.kill();
        finished.push(worker);
    }
    let lines: Vec<String> = finished.iter().flat_map(Worker::lines).collect();
    let mut finals = HashMap::new();
    for session in sessions {
        finals.insert(
            session.to_owned(),
            payload(&store, &storm_key(session)).await,
        );
    }
    let ok = lines.iter().filter(|l| l.starts_with("OK ")).count();
    let rejected = lines.iter().filter(|l| l.starts_with("REJECTED ")).count();
    eprintln!(
        "storm: {kills} kills, {pauses} pauses, {ok} acknowledged turns, {rejected} rejected commits, finals {:?}",
        finals.iter().map(|(s, (v, _))| (s, v)).collect::<Vec<_>>()
    );
    check_linearizable(&finals, &lines);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_redis() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    storm(store, format!("store={}", redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let store = SqliteStore::open(&db).await.unwrap();
    storm(store, format!("store=sqlite:{}", db.display())).await;
}
