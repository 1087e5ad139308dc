//! Workspace snapshots and materialisation, on a local directory (the
//! embedded backend) and on a real S3 server (SeaweedFS).

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use baton_session::SessionKey;
use baton_testkit::{S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3Server, wait_until_async};
use baton_workspace::{Manifest, S3Config, WorkspaceError, WorkspaceStore, manifest_ref};

static S3: OnceLock<S3Server> = OnceLock::new();
const BUCKET: &str = "workspaces";
/// The GC test deletes what it does not know: it gets a bucket of its own.
const GC_BUCKET: &str = "gc-only";

fn s3_config(endpoint: String, bucket: &str) -> S3Config {
    S3Config {
        endpoint,
        bucket: bucket.into(),
        region: "us-east-1".into(),
        access_key_id: S3_ACCESS_KEY_ID.into(),
        secret_access_key: S3_SECRET_ACCESS_KEY.into(),
        force_path_style: true,
    }
}

/// A store on the shared S3 server, once its bucket answers.
async fn s3_store(bucket: &str) -> WorkspaceStore {
    let server = S3.get_or_init(|| S3Server::start(&format!("{BUCKET},{GC_BUCKET}")));
    let store = WorkspaceStore::s3(&s3_config(server.endpoint(), bucket)).unwrap();
    wait_until_async(
        Duration::from_secs(30),
        "the S3 bucket to answer",
        || async { store.list_manifests().await.is_ok() },
    )
    .await;
    store
}

fn write(dir: &Path, name: &str, content: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

/// A session key unique to one test, so tests sharing a bucket never meet.
fn session(name: &str) -> SessionKey {
    SessionKey::new("acme", name).unwrap()
}

async fn round_trip(store: WorkspaceStore, tag: &str) {
    let key = session(&format!("{tag}-round-trip"));
    let agent_dir = tempfile::tempdir().unwrap();
    write(agent_dir.path(), "notes.md", "turn 1\n");
    write(agent_dir.path(), "out/report.txt", "42");
    let v1 = store
        .snapshot(agent_dir.path(), &Manifest::default(), &key, 1, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v1, manifest_ref(&key, 1, 100));

    let other_replica = tempfile::tempdir().unwrap();
    let done = store
        .materialize(Some(&v1), other_replica.path())
        .await
        .unwrap();
    assert_eq!((done.fetched, done.removed), (2, 0));
    assert_eq!(read(other_replica.path(), "notes.md"), "turn 1\n");
    assert_eq!(read(other_replica.path(), "out/report.txt"), "42");

    // Unchanged: nothing written.
    assert_eq!(
        store
            .snapshot(other_replica.path(), &done.manifest, &key, 2, 101)
            .await
            .unwrap(),
        None
    );

    // One file changed, one removed, one added: only changed content is fetched.
    write(other_replica.path(), "notes.md", "turn 1\nturn 2\n");
    std::fs::remove_file(other_replica.path().join("out/report.txt")).unwrap();
    write(other_replica.path(), "copy.txt", "42");
    let v2 = store
        .snapshot(other_replica.path(), &done.manifest, &key, 2, 102)
        .await
        .unwrap()
        .unwrap();
    let again = store
        .materialize(Some(&v2), agent_dir.path())
        .await
        .unwrap();
    assert_eq!(
        (again.fetched, again.removed),
        (2, 1),
        "notes.md and copy.txt fetched, report.txt removed"
    );
    assert_eq!(read(agent_dir.path(), "notes.md"), "turn 1\nturn 2\n");
    let unchanged = store
        .materialize(Some(&v2), agent_dir.path())
        .await
        .unwrap();
    assert_eq!((unchanged.fetched, unchanged.removed), (0, 0));

    // An empty version empties the directory.
    let emptied = store.materialize(None, agent_dir.path()).await.unwrap();
    assert_eq!(emptied.removed, 2);
}

async fn gc_collects_only_unreferenced_old_objects(store: WorkspaceStore, tag: &str) {
    let key = session(&format!("{tag}-gc"));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "shared.txt", "in both versions");
    write(dir.path(), "a.txt", "only in the committed version");
    let committed = store
        .snapshot(dir.path(), &Manifest::default(), &key, 1, 10)
        .await
        .unwrap()
        .unwrap();
    write(dir.path(), "a.txt", "only in the fenced-out turn's version");
    let fenced_out = store
        .snapshot(dir.path(), &Manifest::default(), &key, 1, 11)
        .await
        .unwrap()
        .unwrap();

    let live = HashSet::from([committed.clone()]);
    // Inside the retention window nothing goes: the turn may still commit.
    let report = store.gc(&live, Duration::from_secs(3600)).await.unwrap();
    assert_eq!((report.manifests_deleted, report.blobs_deleted), (0, 0));
    assert!(store.load_manifest(&fenced_out).await.is_ok());

    // Past it, the fenced-out manifest and its own blob go; shared ones stay.
    let report = store.gc(&live, Duration::ZERO).await.unwrap();
    assert_eq!((report.manifests_deleted, report.blobs_deleted), (1, 1));
    assert_eq!(
        store.list_manifests().await.unwrap(),
        std::slice::from_ref(&committed)
    );
    assert!(store.load_manifest(&fenced_out).await.is_err());
    let fresh = tempfile::tempdir().unwrap();
    store
        .materialize(Some(&committed), fresh.path())
        .await
        .unwrap();
    assert_eq!(read(fresh.path(), "a.txt"), "only in the committed version");
    assert_eq!(read(fresh.path(), "shared.txt"), "in both versions");
}

async fn hostile_manifests_and_links_are_refused(store: WorkspaceStore, tag: &str) {
    let key = session(&format!("{tag}-hostile"));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "real.txt", "x");
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
    let reference = store
        .snapshot(dir.path(), &Manifest::default(), &key, 1, 1)
        .await
        .unwrap()
        .unwrap();
    let manifest = store.load_manifest(&reference).await.unwrap();
    assert_eq!(
        manifest.files.keys().collect::<Vec<_>>(),
        ["real.txt"],
        "symlinks are not followed"
    );

    let mut evil = manifest.clone();
    let entry = evil.files.remove("real.txt").unwrap();
    evil.files.insert("../escaped.txt".into(), entry);
    let evil_ref = store.put_manifest_for_test(&key, &evil).await.unwrap();
    let target = tempfile::tempdir().unwrap();
    let inner = target.path().join("ws");
    // Restored without the file it cannot place, which it reports.
    let done = store.materialize(Some(&evil_ref), &inner).await.unwrap();
    assert_eq!(done.unrestorable, ["../escaped.txt"]);
    assert!(!target.path().join("escaped.txt").exists());

    // A directory an agent left symlinks in: where the version has files
    // (`real.txt`, `sub/deep.txt`), materialising replaces the links and
    // never writes through them.
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "victim.txt", "untouched");
    write(dir.path(), "sub/deep.txt", "deep");
    let reference = store
        .snapshot(dir.path(), &Manifest::default(), &key, 2, 2)
        .await
        .unwrap()
        .unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("victim.txt"),
        ws.path().join("real.txt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("sub")).unwrap();
    store
        .materialize(Some(&reference), ws.path())
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(outside.path().join("victim.txt")).unwrap(),
        "untouched"
    );
    assert!(
        !outside.path().join("deep.txt").exists(),
        "nothing written through a linked directory"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("real.txt")).unwrap(),
        "x"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("sub/deep.txt")).unwrap(),
        "deep"
    );
    assert!(
        !std::fs::symlink_metadata(ws.path().join("real.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// One rule for names on both sides: a name the restore could not write
/// is refused when the snapshot is taken (naming the file, storing
/// nothing), and a version that already holds one (written before the
/// rule) restores everything else, reports the rest, and its next snapshot
/// leaves the name out.
async fn a_name_no_restore_could_write_is_refused_at_the_snapshot(
    store: WorkspaceStore,
    tag: &str,
) {
    let key = session(&format!("{tag}-names"));
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ok.txt", "fine");
    write(dir.path(), "x\\y", "z");
    let err = store
        .snapshot(dir.path(), &Manifest::default(), &key, 1, 1)
        .await
        .unwrap_err();
    match &err {
        WorkspaceError::Refused { path, why } => {
            assert_eq!(path, "x\\y");
            assert!(why.contains("backslash"), "{why}");
        }
        other => panic!("expected a refusal, got {other}"),
    }
    assert!(err.to_string().contains("x\\\\y"), "{err}");
    let version_1 = manifest_ref(&key, 1, 1);
    assert!(
        store.load_manifest(&version_1).await.is_err(),
        "a refused snapshot stores no manifest"
    );

    // A version written before the rule, holding such a name.
    std::fs::remove_file(dir.path().join("x\\y")).unwrap();
    let good = store
        .snapshot(dir.path(), &Manifest::default(), &key, 1, 1)
        .await
        .unwrap()
        .unwrap();
    let mut legacy = store.load_manifest(&good).await.unwrap();
    let entry = legacy.files["ok.txt"].clone();
    legacy.files.insert("x\\y".into(), entry);
    let legacy_ref = store.put_manifest_for_test(&key, &legacy).await.unwrap();
    let ws = tempfile::tempdir().unwrap();
    // A leftover of the agent under that name is removed too.
    write(ws.path(), "x\\y", "left over");
    let done = store
        .materialize(Some(&legacy_ref), ws.path())
        .await
        .unwrap();
    assert_eq!(done.unrestorable, ["x\\y"]);
    assert_eq!(read(ws.path(), "ok.txt"), "fine");
    assert!(!ws.path().join("x\\y").exists());
    let next = store
        .snapshot(ws.path(), &done.manifest, &key, 2, 2)
        .await
        .unwrap()
        .expect("the version changed: the bad name is left out");
    let next = store.load_manifest(&next).await.unwrap();
    assert_eq!(next.files.keys().collect::<Vec<_>>(), ["ok.txt"]);
}

#[tokio::test]
async fn local_file_names() {
    let root = tempfile::tempdir().unwrap();
    a_name_no_restore_could_write_is_refused_at_the_snapshot(
        WorkspaceStore::local(root.path()).unwrap(),
        "local",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_file_names() {
    a_name_no_restore_could_write_is_refused_at_the_snapshot(s3_store(BUCKET).await, "s3").await;
}

#[tokio::test]
async fn local_round_trip() {
    let root = tempfile::tempdir().unwrap();
    round_trip(WorkspaceStore::local(root.path()).unwrap(), "local").await;
}

#[tokio::test]
async fn local_gc() {
    let root = tempfile::tempdir().unwrap();
    gc_collects_only_unreferenced_old_objects(WorkspaceStore::local(root.path()).unwrap(), "local")
        .await;
}

#[tokio::test]
async fn local_hostile_input() {
    let root = tempfile::tempdir().unwrap();
    hostile_manifests_and_links_are_refused(WorkspaceStore::local(root.path()).unwrap(), "local")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_round_trip() {
    round_trip(s3_store(BUCKET).await, "s3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_gc() {
    gc_collects_only_unreferenced_old_objects(s3_store(GC_BUCKET).await, "s3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_hostile_input() {
    hostile_manifests_and_links_are_refused(s3_store(BUCKET).await, "s3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_s3_fails_the_snapshot_cleanly() {
    let closed = baton_testkit::free_port();
    let store =
        WorkspaceStore::s3(&s3_config(format!("http://127.0.0.1:{closed}"), BUCKET)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "notes.md", "x");
    let started = std::time::Instant::now();
    let err = store
        .snapshot(dir.path(), &Manifest::default(), &session("down"), 1, 1)
        .await
        .unwrap_err();
    assert!(matches!(err, WorkspaceError::Store(_)), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

/// With S3 unreachable the turn fails before its commit: the replica aborts,
/// the state and its version are as before, the lease is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_with_s3_unreachable_fails_cleanly() {
    use baton_session::*;
    let dir = tempfile::tempdir().unwrap();
    let store = baton_store_sqlite::SqliteStore::open(&dir.path().join("baton.db"))
        .await
        .unwrap();
    let replica = ReplicaId::new("a").unwrap();
    store
        .heartbeat(&replica, Duration::from_secs(60))
        .await
        .unwrap();
    let key = session("s3-down");
    let begin = BeginRequest {
        key: key.clone(),
        replica: replica.clone(),
        turn_seq: None,
        cached_version: None,
        lease_ttl: Duration::from_secs(60),
        state_ttl: Duration::from_secs(3600),
        reclaim_own_lease: false,
        input_digest: None,
    };
    let BeginOutcome::Granted { lease, state } = store.begin(&begin).await.unwrap() else {
        panic!("not granted")
    };

    let closed = baton_testkit::free_port();
    let workspaces =
        WorkspaceStore::s3(&s3_config(format!("http://127.0.0.1:{closed}"), BUCKET)).unwrap();
    let agent_dir = tempfile::tempdir().unwrap();
    let base = workspaces
        .materialize(state.workspace.as_deref(), agent_dir.path())
        .await
        .unwrap();
    write(agent_dir.path(), "notes.md", "work that cannot be stored");
    let stored = workspaces
        .snapshot(
            agent_dir.path(),
            &base.manifest,
            &key,
            lease.version + 1,
            lease.fence,
        )
        .await;
    assert!(matches!(stored, Err(WorkspaceError::Store(_))));

    assert!(
        store.abort(&lease).await.unwrap(),
        "the replica releases the lease"
    );
    let view = store.session(&key).await.unwrap().unwrap();
    assert_eq!((view.version, view.workspace, view.lease), (0, None, None));
    assert!(
        matches!(
            store.begin(&begin).await.unwrap(),
            BeginOutcome::Granted { .. }
        ),
        "the session is free at once"
    );
}
