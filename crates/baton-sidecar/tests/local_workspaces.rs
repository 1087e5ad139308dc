//! A replica keeps session directories between turns only within its
//! budget: beyond it, the least recently used idle ones are deleted, and an
//! evicted session's next turn gets its files back from the object store.
//! In-process engine on the real SQLite store, a local object store and the
//! real reference agent.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_session::*;
use baton_sidecar::agent_client::AgentClient;
use baton_sidecar::engine::{Engine, LocalBudget, TurnAsk};
use baton_store_sqlite::SqliteStore;
use baton_testkit::wait_until_async;
use baton_workspace::WorkspaceStore;

fn ask(session: &str, input: &str) -> TurnAsk {
    TurnAsk {
        key: SessionKey::new("acme", session).unwrap(),
        input: input.into(),
        turn_seq: None,
        wait: Duration::ZERO,
        interrupt: false,
        live: None,
    }
}

fn session_dir(root: &Path, session: &str) -> std::path::PathBuf {
    root.join("acme").join(session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_directories_are_evicted_beyond_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workspace");
    std::fs::create_dir_all(&root).unwrap();
    let store = SqliteStore::open(&dir.path().join("baton.db"))
        .await
        .unwrap();
    let engine = Arc::new(
        Engine::new(
            store,
            WorkspaceStore::local(&dir.path().join("objects")).unwrap(),
            AgentClient::new(&support::agent().await, Duration::from_secs(10)),
            "solo",
            support::timings(),
            root.clone(),
        )
        .unwrap()
        .with_local_budget(LocalBudget {
            max_bytes: 3 << 20,
            max_dirs: 3,
        }),
    );
    engine.heartbeat().await.unwrap();

    // Two sessions of 2 MiB each: the budget holds one.
    engine.turn(ask("a", "/fill a.bin 2")).await.unwrap();
    engine.turn(ask("b", "/fill b.bin 2")).await.unwrap();
    wait_until_async(Duration::from_secs(10), "a's directory deleted", || async {
        !session_dir(&root, "a").exists()
    })
    .await;
    assert!(session_dir(&root, "b").join("g1").exists() || session_dir(&root, "b").exists());
    let (bytes, dirs) = engine.local_usage();
    assert!(bytes <= 3 << 20, "{bytes} bytes kept");
    assert_eq!(dirs, 1);

    // a comes back: its file is downloaded again, whole.
    engine.turn(ask("a", "hello again")).await.unwrap();
    let a_files: Vec<_> = walk(&session_dir(&root, "a"));
    let a_bin = a_files
        .iter()
        .find(|p| p.ends_with("a.bin"))
        .expect("a.bin materialised again");
    assert_eq!(std::fs::metadata(a_bin).unwrap().len(), 2 << 20);

    // The directory count bounds too: small sessions, three at most.
    for s in ["c", "d", "e", "f"] {
        engine.turn(ask(s, "small")).await.unwrap();
    }
    wait_until_async(
        Duration::from_secs(10),
        "at most three directories",
        || async { std::fs::read_dir(root.join("acme")).unwrap().count() <= 3 },
    )
    .await;
    assert!(engine.local_usage().1 <= 3);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}
