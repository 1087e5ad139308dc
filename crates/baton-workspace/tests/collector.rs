//! The scheduled workspace collector (`collector.rs`) on real stores: one
//! replica collects at a time, it keeps every workspace a current state or
//! a durable copy names, it deletes garbage only at its second look, so a
//! blob a turn reused in between survives, and it deletes nothing when the
//! live set cannot be read.

use baton_session_contract::cases;
use baton_session_contract::servers as ledgered;

use std::path::Path;
use std::time::Duration;

use baton_session::*;
use baton_store_sqlite::SqliteStore;
use baton_testkit::wait_until_async;
use baton_workspace::collector::{Collector, CollectorSettings};
use baton_workspace::{Manifest, WorkspaceStore};
use cases::{begin_req, commit_req, granted, key, replica};
use ledgered::Private;

const SETTINGS: CollectorSettings = CollectorSettings {
    interval: Duration::from_secs(3600),
    // Everything is old at once: what keeps an object is being live or
    // listed, and the second look.
    retention: Duration::ZERO,
};

/// A turn that writes `notes` as the session's workspace and commits it;
/// returns the manifest reference.
async fn turn_with_notes<S: TurnStore>(
    store: &S,
    workspaces: &WorkspaceStore,
    session: &SessionKey,
    replica: &ReplicaId,
    notes: &str,
) -> String {
    let (lease, reference) = upload_notes(store, workspaces, session, replica, notes).await;
    commit_notes(store, &lease, &reference).await;
    reference
}

/// The first half of such a turn: granted, its workspace uploaded.
async fn upload_notes<S: TurnStore>(
    store: &S,
    workspaces: &WorkspaceStore,
    session: &SessionKey,
    replica: &ReplicaId,
    notes: &str,
) -> (Lease, String) {
    let (lease, _) = granted(store, &begin_req(session, replica, None)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.md"), notes).unwrap();
    let reference = workspaces
        .snapshot(
            dir.path(),
            &Manifest::default(),
            session,
            lease.version + 1,
            lease.fence,
        )
        .await
        .unwrap()
        .unwrap();
    (lease, reference)
}

/// The second half: the commit.
async fn commit_notes<S: TurnStore>(store: &S, lease: &Lease, reference: &str) {
    let mut commit = commit_req(lease, "state", "reply");
    commit.workspace = Some(reference.to_owned());
    assert!(matches!(
        store.commit(&commit).await.unwrap(),
        CommitOutcome::Committed { .. }
    ));
}

async fn notes_of(workspaces: &WorkspaceStore, reference: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    workspaces
        .materialize(Some(reference), dir.path())
        .await
        .unwrap();
    std::fs::read_to_string(dir.path().join("notes.md")).unwrap()
}

/// Files under `dir`: the local object store's objects.
fn count_objects(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let path = e.path();
                    if path.is_dir() {
                        count_objects(&path)
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The whole story on one store, whichever it is.
/// Returns the collector that holds the lease.
async fn collects_twice_and_keeps_what_sessions_use<S: TurnStore + WorkspaceRoots + Clone>(
    store: S,
    other_replica_view: S,
    objects_dir: &Path,
) -> Collector<S> {
    let workspaces = WorkspaceStore::local(objects_dir).unwrap();
    let a = replica(&store, "a").await;
    let first = turn_with_notes(&store, &workspaces, &key("one"), &a, "a1\n").await;
    let current = turn_with_notes(&store, &workspaces, &key("one"), &a, "a1\na2\n").await;
    assert_eq!(count_objects(objects_dir), 4, "two manifests, two blobs");
    // A turn of another session is running: it has uploaded a workspace
    // that reuses the first version's blob ("a1\n", content-addressed, so
    // not written again) and commits only after the collector's first
    // look, which finds that blob garbage (no live manifest lists it).
    let (running, reused) = upload_notes(&store, &workspaces, &key("two"), &a, "a1\n").await;

    let mut collector = Collector::new(store.clone(), workspaces.clone(), "collector-1", SETTINGS);
    let mut other = Collector::new(
        other_replica_view,
        workspaces.clone(),
        "collector-2",
        SETTINGS,
    );
    // The first look deletes nothing (a one-pass gc would have deleted the
    // blob under the running turn); the other replica does not collect.
    let report = collector
        .run_once()
        .await
        .unwrap()
        .expect("holds the lease");
    assert_eq!((report.manifests_deleted, report.blobs_deleted), (0, 0));
    assert!(other.run_once().await.unwrap().is_none());
    commit_notes(&store, &running, &reused).await;

    // The second look deletes the first manifest only: its blob is listed
    // again, by the turn that reused it.
    let report = collector
        .run_once()
        .await
        .unwrap()
        .expect("holds the lease");
    assert_eq!((report.manifests_deleted, report.blobs_deleted), (1, 0));
    assert_eq!(notes_of(&workspaces, &current).await, "a1\na2\n");
    assert_eq!(notes_of(&workspaces, &reused).await, "a1\n");
    assert!(workspaces.load_manifest(&first).await.is_err());
    // Nothing else is garbage: later runs delete nothing.
    let report = collector.run_once().await.unwrap().unwrap();
    assert_eq!((report.manifests_deleted, report.blobs_deleted), (0, 0));
    assert_eq!(
        count_objects(objects_dir),
        4,
        "two live manifests, two blobs"
    );
    collector
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_and_postgres() {
    let mut servers = Private::start("collector");
    let store = baton_ledger::RedisLedgerStore::connect(&servers.redis.url(), &servers.database)
        .await
        .unwrap();
    let view = baton_ledger::RedisLedgerStore::connect(&servers.redis.url(), &servers.database)
        .await
        .unwrap();
    let objects = tempfile::tempdir().unwrap();
    let mut collector =
        collects_twice_and_keeps_what_sessions_use(store.clone(), view, objects.path()).await;

    // Once shipped, the durable copies keep the live workspaces (the
    // unshipped index is empty then).
    wait_until_async(Duration::from_secs(30), "the turns shipped", || async {
        store.oldest_unshipped_ms().is_none()
    })
    .await;
    let live = store.live_workspaces().await.unwrap();
    assert_eq!(live.len(), 2, "{live:?}");

    // Without Postgres there is no live set: the run fails, nothing is
    // deleted, even what would be garbage by then.
    let workspaces = WorkspaceStore::local(objects.path()).unwrap();
    let a = replica(&store, "a").await;
    turn_with_notes(&store, &workspaces, &key("one"), &a, "a1\na2\na3\n").await;
    servers.postgres.stop();
    let before = count_objects(objects.path());
    for _ in 0..2 {
        assert!(collector.run_once().await.is_err());
    }
    assert_eq!(count_objects(objects.path()), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let store = SqliteStore::open(&db).await.unwrap();
    let view = SqliteStore::open(&db).await.unwrap();
    collects_twice_and_keeps_what_sessions_use(store, view, &dir.path().join("objects")).await;
}
