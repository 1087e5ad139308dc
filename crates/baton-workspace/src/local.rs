//! The agent's directory on this machine: walking it, hashing its files
//! (remembering hashes while a file looks unchanged), and writing a
//! version's files into it.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use baton_session::turn_record::digest;

use crate::names::check_file_name;
use crate::{FileEntry, MAX_FILE_BYTES, MAX_FILES, Manifest, WorkspaceError, WorkspaceResult};

/// How a local file looked (size, modification and change times, inode)
/// when it was hashed, and its hash. A file that still looks exactly so is
/// not read and hashed again: with hundreds of megabytes of workspace, that
/// is the difference between a turn that stats a few files and one that
/// reads all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    size: u64,
    modified: (i64, i64),
    changed: (i64, i64),
    inode: u64,
    blob: String,
}

/// A file modified less than this before it was hashed may change again
/// within the same timestamp tick (filesystem clocks are coarse: a few ms
/// on ext4, seconds on some others), so its look proves nothing: it is
/// hashed again next time. Git calls such entries "racily clean".
pub(crate) const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The hashes of a directory's files, by relative name, each valid while
/// the file looks as it did (see [`Seen`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalFiles(HashMap<String, Seen>);

impl LocalFiles {
    /// The hash of `name` if `meta` shows it unchanged since it was hashed.
    pub(crate) fn hash_of(&self, name: &str, meta: &std::fs::Metadata) -> Option<FileEntry> {
        let seen = self.0.get(name)?;
        (seen.size == meta.len()
            && seen.modified == (meta.mtime(), meta.mtime_nsec())
            && seen.changed == (meta.ctime(), meta.ctime_nsec())
            && seen.inode == meta.ino())
        .then(|| FileEntry {
            blob: seen.blob.clone(),
            size: seen.size,
        })
    }

    /// Remembers `entry` as the hash of `name` as `meta` shows it, read at
    /// `hashed_at`, unless the file changed too shortly before.
    pub(crate) fn remember(
        &mut self,
        name: &str,
        meta: &std::fs::Metadata,
        entry: &FileEntry,
        hashed_at: SystemTime,
    ) {
        let recent = |secs: i64, nanos: i64| {
            let at = SystemTime::UNIX_EPOCH
                + Duration::new(secs.max(0) as u64, nanos.clamp(0, 999_999_999) as u32);
            at + RACY_WINDOW > hashed_at
        };
        if recent(meta.mtime(), meta.mtime_nsec()) || recent(meta.ctime(), meta.ctime_nsec()) {
            return;
        }
        self.0.insert(
            name.to_owned(),
            Seen {
                size: meta.len(),
                modified: (meta.mtime(), meta.mtime_nsec()),
                changed: (meta.ctime(), meta.ctime_nsec()),
                inode: meta.ino(),
                blob: entry.blob.clone(),
            },
        );
    }

    /// How many files' hashes are remembered.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Runs filesystem work (walking, reading, hashing) on tokio's blocking
/// pool: on a runtime thread it would stall every other task there, the
/// lease renewals of other turns among them.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> WorkspaceResult<T> + Send + 'static,
) -> WorkspaceResult<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| WorkspaceError::Io(std::io::Error::other(format!("workspace task: {e}"))))?
}

/// The `/`-separated name of `file` inside `root`, refusing one that
/// breaks [`check_file_name`]: the turn fails (AGENT_FAILED, naming the
/// file) and commits nothing, rather than commit a file no replica could
/// restore.
pub(crate) fn relative_name(root: &Path, file: &Path) -> WorkspaceResult<String> {
    let relative = file
        .strip_prefix(root)
        .map_err(|_| WorkspaceError::Refused {
            path: file.display().to_string(),
            why: "outside the workspace",
        })?;
    let mut parts = Vec::new();
    for part in relative.components() {
        match part {
            Component::Normal(p) => {
                parts.push(p.to_str().ok_or_else(|| WorkspaceError::Refused {
                    path: relative.display().to_string(),
                    why: "file names must be UTF-8",
                })?)
            }
            _ => {
                return Err(WorkspaceError::Refused {
                    path: relative.display().to_string(),
                    why: "not a plain relative path",
                });
            }
        }
    }
    let name = parts.join("/");
    check_file_name(&name).map_err(|why| WorkspaceError::Refused {
        path: name.chars().take(256).collect(),
        why,
    })?;
    Ok(name)
}

/// Where `name` from a manifest goes under `root`, refusing names that
/// break [`check_file_name`] (a hostile or an older manifest).
pub(crate) fn local_path(root: &Path, name: &str) -> WorkspaceResult<PathBuf> {
    check_file_name(name).map_err(|why| WorkspaceError::Corrupt {
        what: name.chars().take(256).collect(),
        why,
    })?;
    let mut path = root.to_path_buf();
    path.extend(name.split('/'));
    Ok(path)
}

/// Removes whatever is not a plain directory on the way to `root/name`, and
/// whatever is not a regular file at it (symlinks above all); returns how
/// many entries it removed.
pub(crate) fn clear_non_files(root: &Path, name: &str) -> WorkspaceResult<usize> {
    let mut path = root.to_path_buf();
    let parts: Vec<&str> = name.split('/').collect();
    let mut removed = 0;
    for (i, part) in parts.iter().enumerate() {
        path.push(part);
        let last = i + 1 == parts.len();
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
            Err(e) => return Err(e.into()),
        };
        let kind = meta.file_type();
        let fits = if last { kind.is_file() } else { kind.is_dir() };
        if !fits {
            if kind.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                // A symlink is removed itself, never what it points to.
                std::fs::remove_file(&path)?;
            }
            removed += 1;
            return Ok(removed);
        }
    }
    Ok(removed)
}

/// Regular files under `root`, recursively; symlinks are skipped (never followed).
pub(crate) fn walk(root: &Path) -> WorkspaceResult<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir == root => return Ok(files),
            Err(e) => return Err(e.into()),
        };
        for entry in entries {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
                if files.len() > MAX_FILES {
                    return Err(WorkspaceError::Refused {
                        path: root.display().to_string(),
                        why: "more than 10000 files",
                    });
                }
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Reads and hashes the file at `path`, which `meta` describes.
pub(crate) fn file_entry(
    path: &Path,
    meta: &std::fs::Metadata,
) -> WorkspaceResult<(FileEntry, Vec<u8>)> {
    if meta.len() > MAX_FILE_BYTES {
        return Err(WorkspaceError::Refused {
            path: path.display().to_string(),
            why: "larger than 64 MiB",
        });
    }
    let content = std::fs::read(path)?;
    Ok((
        FileEntry {
            blob: digest(&content),
            size: content.len() as u64,
        },
        content,
    ))
}

/// The local side of materialising: removes what `manifest` does not list
/// and anything not a plain file where one goes, and answers which files
/// need their blob (absent or different here). Blocking.
pub(crate) fn compare_local(dir: &Path, manifest: &Manifest) -> WorkspaceResult<LocalComparison> {
    std::fs::create_dir_all(dir)?;
    let mut removed = 0;
    for file in walk(dir)? {
        // A local file whose name breaks the rule was never restored from
        // a version: an earlier turn's leftover, removed like any other.
        let listed = relative_name(dir, &file)
            .is_ok_and(|name| manifest.files.contains_key(&name) && check_file_name(&name).is_ok());
        if !listed {
            std::fs::remove_file(&file)?;
            removed += 1;
        }
    }
    let mut files = LocalFiles::default();
    let mut missing = Vec::new();
    let mut unrestorable = Vec::new();
    for (name, entry) in &manifest.files {
        let Ok(path) = local_path(dir, name) else {
            unrestorable.push(name.clone());
            continue;
        };
        // An agent may have left a symlink (or a directory) where a file
        // goes, or as one of its parents: never read or write through it.
        removed += clear_non_files(dir, name)?;
        let hashed_at = SystemTime::now();
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() && meta.len() == entry.size => {
                let (found, _) = file_entry(&path, &meta)?;
                if found == *entry {
                    files.remember(name, &meta, entry, hashed_at);
                    continue;
                }
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        missing.push(name.clone());
    }
    Ok(LocalComparison {
        missing,
        removed,
        unrestorable,
        files,
    })
}

/// What [`compare_local`] found.
pub(crate) struct LocalComparison {
    /// Files to download.
    pub(crate) missing: Vec<String>,
    pub(crate) removed: usize,
    pub(crate) unrestorable: Vec<String>,
    pub(crate) files: LocalFiles,
}

/// Content to upload, by blob hash.
type NewBlobs = Vec<(String, Vec<u8>)>;

/// Up to this many files and this many bytes to hash, a snapshot runs on
/// the runtime thread: handing it to the blocking pool and back costs more
/// (two thread wake-ups, measured at about 100 µs of system CPU per turn)
/// than walking a few files. Beyond, it runs on the blocking pool.
pub(crate) const INLINE_FILES: usize = 64;
pub(crate) const INLINE_HASH_BYTES: u64 = 256 * 1024;

/// A snapshot's walk: every file of the directory, and for each the hash
/// remembered for it when it looks unchanged.
pub(crate) struct ScanPlan {
    pub(crate) files: Vec<(String, PathBuf, std::fs::Metadata, Option<FileEntry>)>,
    /// Bytes of the files that must be read and hashed.
    pub(crate) to_hash: u64,
}

/// Walks `dir` and stats its files. Blocking, but cheap for a small
/// workspace.
pub(crate) fn plan_scan(dir: &Path, seen: &LocalFiles) -> WorkspaceResult<ScanPlan> {
    let mut plan = ScanPlan {
        files: Vec::new(),
        to_hash: 0,
    };
    for file in walk(dir)? {
        let name = relative_name(dir, &file)?;
        let meta = std::fs::symlink_metadata(&file)?;
        let remembered = seen.hash_of(&name, &meta);
        if remembered.is_none() {
            plan.to_hash += meta.len();
        }
        plan.files.push((name, file, meta, remembered));
    }
    Ok(plan)
}

/// The local side of a snapshot: every file with its hash, and the content
/// of those whose blob `base` does not already have. Files that look as
/// they did when last hashed are not read. Blocking.
pub(crate) fn finish_scan(
    plan: ScanPlan,
    base: &Manifest,
) -> WorkspaceResult<(Manifest, NewBlobs, LocalFiles)> {
    let known: HashSet<&str> = base.files.values().map(|e| e.blob.as_str()).collect();
    let mut manifest = Manifest::default();
    let mut new_blobs = Vec::new();
    let mut files = LocalFiles::default();
    for (name, path, meta, remembered) in plan.files {
        match remembered {
            // Known to the base, so uploaded: nothing to read.
            Some(entry) if known.contains(entry.blob.as_str()) => {
                files.remember(&name, &meta, &entry, SystemTime::now());
                manifest.files.insert(name, entry);
            }
            // Not remembered, or remembered from a snapshot that was never
            // committed (its blob may never have been uploaded): read it.
            _ => {
                let hashed_at = SystemTime::now();
                let (entry, content) = file_entry(&path, &meta)?;
                if !known.contains(entry.blob.as_str()) {
                    new_blobs.push((entry.blob.clone(), content));
                }
                files.remember(&name, &meta, &entry, hashed_at);
                manifest.files.insert(name, entry);
            }
        }
    }
    Ok((manifest, new_blobs, files))
}

/// [`plan_scan`] then [`finish_scan`], on the runtime thread when the work
/// is small, else on the blocking pool.
pub(crate) async fn scan_local(
    dir: &Path,
    base: &Manifest,
    seen: &LocalFiles,
) -> WorkspaceResult<(Manifest, NewBlobs, LocalFiles)> {
    if base.files.len() > INLINE_FILES {
        let (dir, base, seen) = (dir.to_owned(), base.clone(), seen.clone());
        return blocking(move || finish_scan(plan_scan(&dir, &seen)?, &base)).await;
    }
    let plan = plan_scan(dir, seen)?;
    if plan.files.len() <= INLINE_FILES && plan.to_hash <= INLINE_HASH_BYTES {
        return finish_scan(plan, base);
    }
    let base = base.clone();
    blocking(move || finish_scan(plan, &base)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_aged(path: &Path, content: &str, age: Duration) -> std::fs::Metadata {
        std::fs::write(path, content).unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
        std::fs::symlink_metadata(path).unwrap()
    }

    fn entry_of(content: &str) -> FileEntry {
        FileEntry {
            blob: digest(content.as_bytes()),
            size: content.len() as u64,
        }
    }

    /// A remembered hash holds only while the file looks the same, and a
    /// file that changed just before it was hashed is not remembered.
    #[test]
    fn a_remembered_hash_holds_only_for_a_file_that_looks_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.md");
        let old = Duration::from_secs(3600);
        let meta = write_aged(&path, "first", old);
        let mut files = LocalFiles::default();
        // Its change time (ctime, which no one can set) is now: too recent.
        files.remember("notes.md", &meta, &entry_of("first"), SystemTime::now());
        assert!(files.is_empty(), "a racily clean file was remembered");
        let later = SystemTime::now() + RACY_WINDOW + Duration::from_secs(1);
        files.remember("notes.md", &meta, &entry_of("first"), later);
        assert_eq!(files.hash_of("notes.md", &meta), Some(entry_of("first")));
        assert_eq!(files.hash_of("other.md", &meta), None);

        // Same size, same modification time set back: the change time moved.
        let rewritten = write_aged(&path, "fifth", old);
        assert_eq!(rewritten.len(), meta.len());
        assert_eq!(rewritten.mtime(), meta.mtime());
        if rewritten.ctime_nsec() != meta.ctime_nsec() || rewritten.ctime() != meta.ctime() {
            assert_eq!(files.hash_of("notes.md", &rewritten), None);
        }
        // Another size is another file, whatever the times say.
        let grown = write_aged(&path, "first and more", old);
        assert_eq!(files.hash_of("notes.md", &grown), None);
    }

    proptest::proptest! {
        /// Any bytes as a file's path (parts split at `/`, as a file system
        /// holds them): what a snapshot accepts, a restore writes back to
        /// the same place; what it refuses, it refuses naming the file.
        #[test]
        fn a_name_the_snapshot_accepts_is_one_the_restore_writes(
            parts in proptest::collection::vec(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 1..40),
                1..4,
            ),
        ) {
            use std::os::unix::ffi::OsStrExt as _;
            // A file system part holds neither `/` nor NUL.
            let parts: Vec<Vec<u8>> = parts
                .into_iter()
                .map(|p| p.into_iter().filter(|b| *b != b'/' && *b != 0).collect::<Vec<u8>>())
                .filter(|p| !p.is_empty())
                .collect();
            proptest::prop_assume!(!parts.is_empty());
            let root = Path::new("/ws/a");
            let mut file = root.to_path_buf();
            for part in &parts {
                file.push(std::ffi::OsStr::from_bytes(part));
            }
            match relative_name(root, &file) {
                Ok(name) => {
                    proptest::prop_assert_eq!(check_file_name(&name), Ok(()));
                    let other = Path::new("/ws/b");
                    let restored = local_path(other, &name).unwrap();
                    proptest::prop_assert_eq!(
                        restored.strip_prefix(other).unwrap(),
                        file.strip_prefix(root).unwrap()
                    );
                }
                Err(WorkspaceError::Refused { path, why }) => {
                    proptest::prop_assert!(!why.is_empty());
                    proptest::prop_assert!(!path.is_empty());
                }
                Err(e) => proptest::prop_assert!(false, "unexpected error {e}"),
            }
        }

        /// Any string a manifest may name a file by: the restore writes it
        /// only when the rule accepts it, and then inside the workspace.
        #[test]
        fn the_restore_writes_only_names_the_rule_accepts(name in proptest::prelude::any::<String>()) {
            let root = Path::new("/ws/a");
            match local_path(root, &name) {
                Ok(path) => {
                    proptest::prop_assert_eq!(check_file_name(&name), Ok(()));
                    proptest::prop_assert!(path.starts_with(root));
                    proptest::prop_assert_eq!(relative_name(root, &path).unwrap(), name);
                }
                Err(_) => proptest::prop_assert!(check_file_name(&name).is_err()),
            }
        }
    }
}
