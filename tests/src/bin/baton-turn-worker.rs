//! `baton-turn-worker`: runs turns against a store from the command line,
//! one replica per process. The fault tests start several, then kill, pause
//! and resume them; it is also a quick way to poke at a store by hand.
//!
//! ```text
//! baton-turn-worker store=redis://127.0.0.1:6379/ [database=postgres://…] replica=r1 \
//!     sessions=s1,s2 turns=100 seed=7 [hold_ms=0] [hold_max_ms=0] [lease_ttl_ms=2000] [heartbeat_ms=100] \
//!     [workspace=DIR]
//! baton-turn-worker store=sqlite:/tmp/baton.db …
//! ```
//!
//! Each turn appends its id (`<replica>-<n>`) to the session's payload (a
//! comma-separated list) and, with `workspace=`, to `log.txt` in the session's
//! workspace. Output, one line per event, flushed at once:
//! `GRANTED <session> <version> <fence>`, `INTENT <session> <turn id>`,
//! `OK <session> <version> <turn id>`, `REJECTED <session> <outcome> <turn id>`.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use baton_ledger::RedisLedgerStore;
use baton_session::*;
use baton_store_redis::RedisStore;
use baton_store_sqlite::SqliteStore;
use baton_workspace::WorkspaceStore;
use bytes::Bytes;

struct Options {
    replica: ReplicaId,
    sessions: Vec<SessionKey>,
    turns: u64,
    seed: u64,
    hold: Duration,
    /// Each turn also holds a random 0..hold_max extra, so pauses land mid-turn.
    hold_max: u64,
    lease_ttl: Duration,
    heartbeat: Duration,
    workspace: Option<PathBuf>,
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A small deterministic generator (xorshift), so a seed replays a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

async fn run<S: TurnStore + Clone + 'static>(store: S, o: Options) {
    let beat = {
        let (store, replica, every) = (store.clone(), o.replica.clone(), o.heartbeat);
        tokio::spawn(async move {
            loop {
                let _ = store.heartbeat(&replica, every * 4).await;
                tokio::time::sleep(every).await;
            }
        })
    };
    store
        .heartbeat(&o.replica, o.heartbeat * 4)
        .await
        .expect("first heartbeat");
    let workspaces = o
        .workspace
        .as_ref()
        .map(|dir| WorkspaceStore::local(dir).expect("workspace store"));
    let mut rng = Rng(o.seed.max(1));
    for n in 1..=o.turns {
        let key = &o.sessions[usize::try_from(rng.next() % o.sessions.len() as u64).unwrap_or(0)];
        let turn_id = format!("{}-{n}", o.replica);
        let req = BeginRequest {
            key: key.clone(),
            replica: o.replica.clone(),
            turn_seq: None,
            cached_version: None,
            lease_ttl: o.lease_ttl,
            state_ttl: Duration::from_secs(3600),
            reclaim_own_lease: false,
            input_digest: None,
        };
        let (lease, state) = loop {
            match store.begin(&req).await {
                Ok(BeginOutcome::Granted { lease, state }) => break (lease, state),
                Ok(BeginOutcome::Busy { .. }) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(rng.next() % 5 + 1)).await;
                }
                Ok(other) => panic!("unexpected {other:?}"),
            }
        };
        say(format!(
            "GRANTED {} {} {}",
            key.session, lease.version, lease.fence
        ));
        let started_at_ms = turn_record::now_ms();
        let hold = o.hold
            + Duration::from_millis(if o.hold_max > 0 {
                rng.next() % o.hold_max
            } else {
                0
            });
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        let old = String::from_utf8(state.payload.unwrap_or_default().to_vec()).unwrap_or_default();
        let payload = if old.is_empty() {
            turn_id.clone()
        } else {
            format!("{old},{turn_id}")
        };
        let mut workspace = state.workspace.clone();
        if let Some(ws) = &workspaces {
            let dir = tempfile::tempdir().expect("temp dir");
            let base = ws
                .materialize(state.workspace.as_deref(), dir.path())
                .await
                .expect("materialize");
            let log = dir.path().join("log.txt");
            let mut text = std::fs::read_to_string(&log).unwrap_or_default();
            text.push_str(&format!("{turn_id}\n"));
            std::fs::write(&log, text).expect("write log.txt");
            workspace = ws
                .snapshot(
                    dir.path(),
                    &base.manifest,
                    key,
                    lease.version + 1,
                    lease.fence,
                )
                .await
                .expect("snapshot")
                .or(workspace);
        }
        say(format!("INTENT {} {turn_id}", key.session));
        let commit = CommitRequest {
            lease: lease.clone(),
            expected_version: lease.version,
            payload: Bytes::from(payload),
            workspace,
            reply: Bytes::from(format!("done {turn_id}")),
            state_ttl: Duration::from_secs(3600),
            started_at_ms,
            input_digest: turn_record::digest(turn_id.as_bytes()),
            input: None,
        };
        match store.commit(&commit).await {
            Ok(CommitOutcome::Committed { version }) => {
                say(format!("OK {} {version} {turn_id}", key.session))
            }
            Ok(other) => say(format!("REJECTED {} {other:?} {turn_id}", key.session)),
            Err(e) => say(format!("REJECTED {} error:{e} {turn_id}", key.session)),
        }
    }
    beat.abort();
    say("DONE".into());
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: HashMap<String, String> = std::env::args()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let get = |k: &str| args.get(k).cloned();
    let num = |k: &str, default: u64| {
        get(k).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| panic!("{k}: not a number"))
        })
    };
    let options = Options {
        replica: ReplicaId::new(get("replica").expect("replica=")).expect("replica id"),
        sessions: get("sessions")
            .expect("sessions=")
            .split(',')
            .map(|s| SessionKey::new("storm", s).expect("session id"))
            .collect(),
        turns: num("turns", 10),
        seed: num("seed", 1),
        hold: Duration::from_millis(num("hold_ms", 0)),
        hold_max: num("hold_max_ms", 0),
        lease_ttl: Duration::from_millis(num("lease_ttl_ms", 2000)),
        heartbeat: Duration::from_millis(num("heartbeat_ms", 100)),
        workspace: get("workspace").map(PathBuf::from),
    };
    let store = get("store").expect("store=");
    if let Some(path) = store.strip_prefix("sqlite:") {
        run(
            SqliteStore::open(std::path::Path::new(path))
                .await
                .expect("sqlite"),
            options,
        )
        .await;
    } else if let Some(database) = get("database") {
        run(
            RedisLedgerStore::connect(&store, &database)
                .await
                .expect("redis+postgres"),
            options,
        )
        .await;
    } else {
        run(RedisStore::connect(&store).await.expect("redis"), options).await;
    }
}
