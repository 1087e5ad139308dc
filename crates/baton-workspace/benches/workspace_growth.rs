//! What an append-only workspace file costs the object store, turn by turn:
//! a session whose agent appends a line to `notes.md` every turn (1,000
//! turns), and one whose agent appends 1 KiB to a 1 MiB log (100 turns).
//! Blobs are whole files, content-addressed, so every turn that changes a
//! file stores all of it again; the scheduled collector deletes the old
//! versions once they are past the retention window.
//!
//! ```text
//! cargo bench -p baton-workspace --bench workspace_growth
//! ```
//!
//! Figures: bytes the object store holds after the turns (every version
//! kept, as within the retention window), bytes written by the average and
//! by the last turn, and bytes left once every version but the current one
//! is collected. The store is a local directory: S3 stores the same
//! objects.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use baton_session::SessionKey;
use baton_workspace::{LocalFiles, Manifest, WorkspaceStore};

fn stored_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let path = e.path();
                    if path.is_dir() {
                        stored_bytes(&path)
                    } else {
                        e.metadata().map(|m| m.len()).unwrap_or(0)
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

struct Growth {
    turns: u64,
    file_bytes: u64,
    stored_bytes: u64,
    last_turn_bytes: u64,
    after_collect_bytes: u64,
}

/// `turns` turns, each appending `line` to `name` (which starts as
/// `initial`), each snapshotted as a turn does it.
async fn append_only(name: &str, initial: &[u8], line: &[u8], turns: u64) -> Growth {
    let objects = tempfile::tempdir().unwrap();
    let store = WorkspaceStore::local(objects.path()).unwrap();
    let workdir = tempfile::tempdir().unwrap();
    let key = SessionKey::new("bench", name).unwrap();
    let path = workdir.path().join(name);
    std::fs::write(&path, initial).unwrap();
    let mut base = Manifest::default();
    let mut seen = LocalFiles::default();
    let mut current = None;
    let mut before_last = 0;
    for turn in 1..=turns {
        let mut content = std::fs::read(&path).unwrap();
        content.extend_from_slice(line);
        std::fs::write(&path, &content).unwrap();
        before_last = stored_bytes(objects.path());
        let snapshot = store
            .snapshot_manifest(workdir.path(), &base, &seen, &key, turn, turn)
            .await
            .unwrap();
        current = snapshot.reference.or(current);
        base = snapshot.manifest;
        seen = snapshot.files;
    }
    let stored = stored_bytes(objects.path());
    let live = HashSet::from([current.unwrap()]);
    store.gc(&live, Duration::ZERO).await.unwrap();
    Growth {
        turns,
        file_bytes: std::fs::metadata(&path).unwrap().len(),
        stored_bytes: stored,
        last_turn_bytes: stored - before_last,
        after_collect_bytes: stored_bytes(objects.path()),
    }
}

fn row(what: &str, g: &Growth) {
    println!(
        "| {what} | {} | {} | {} | {} | {} | {} |",
        g.turns,
        g.file_bytes,
        g.stored_bytes,
        g.stored_bytes / g.turns,
        g.last_turn_bytes,
        g.after_collect_bytes
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let notes_line = b"- turn note: the user prefers short answers, in Chinese\n";
    let notes = append_only("notes.md", b"", notes_line, 1000).await;
    let log = append_only("agent.log", &vec![b'x'; 1 << 20], &[b'y'; 1024], 100).await;
    println!(
        "| file | turns | file bytes at the end | bytes stored (all versions) | stored per turn | last turn | after collecting |"
    );
    println!("|---|---|---|---|---|---|---|");
    row(
        &format!("`notes.md`, +{} B per turn", notes_line.len()),
        &notes,
    );
    row("`agent.log`, 1 MiB + 1 KiB per turn", &log);
}
