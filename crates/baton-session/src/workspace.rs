//! Workspace files in an object store: immutable content-addressed blobs
//! and one manifest per committed version.
//!
//! A turn's files are snapshotted after the agent ran: each changed file is
//! uploaded once as `blobs/<sha256>` (never overwritten; identical content is
//! stored once), then a manifest listing every file is written under a key
//! that carries the version and the fence, and the commit stores that key in
//! the session state. A fenced-out turn's manifest is therefore never
//! referenced, and [`WorkspaceStore::gc`] collects it with its blobs once
//! they are older than the retention window.
//!
//! The same code runs on S3 (MinIO, SeaweedFS, AWS) and, for `baton dev`, on
//! a local directory: both are `object_store` implementations.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, PutMode, PutOptions, RetryConfig};
use serde::{Deserialize, Serialize};

use crate::id_encoding::path_part;
use crate::ids::SessionKey;
use crate::turn_record::digest;

/// Largest single workspace file.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Most files in one workspace.
pub const MAX_FILES: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("workspace directory: {0}")]
    Io(#[from] std::io::Error),
    #[error("workspace file {path:?} refused: {why}")]
    Refused { path: String, why: &'static str },
    #[error("manifest {0} is malformed: {1}")]
    BadManifest(String, serde_json::Error),
    /// Stored data this code never writes: a manifest entry with a forged
    /// name or hash, a blob whose content does not match its hash.
    #[error("stored workspace data is corrupt: {what:?}: {why}")]
    Corrupt { what: String, why: &'static str },
}

pub type WorkspaceResult<T> = Result<T, WorkspaceError>;

/// One file of a workspace version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// SHA-256 of the content, hex: the blob's name.
    pub blob: String,
    pub size: u64,
}

/// Every file of one workspace version, by relative path (`/`-separated).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub files: BTreeMap<String, FileEntry>,
}

/// Connection settings of an S3-compatible store.
#[derive(Clone, Debug)]
pub struct S3Config {
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// `endpoint/bucket/key` addressing (MinIO, SeaweedFS) instead of
    /// `bucket.endpoint/key`.
    pub force_path_style: bool,
}

/// What [`WorkspaceStore::gc`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub manifests_deleted: usize,
    pub blobs_deleted: usize,
}

/// What [`WorkspaceStore::materialize`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Materialized {
    pub manifest: Manifest,
    /// Blobs downloaded: files already present with the right content are not.
    pub fetched: usize,
    /// Local files removed because the version does not have them.
    pub removed: usize,
    /// Files of the version that were not restored because their names
    /// break [`check_file_name`] (a version written before the rule, or
    /// forged): the turn runs without them, and its commit leaves them out.
    pub unrestorable: Vec<String>,
    /// What the directory's files looked like when they were checked, for
    /// the next [`WorkspaceStore::snapshot_manifest`].
    pub files: LocalFiles,
}

/// What [`WorkspaceStore::snapshot_manifest`] found.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The new manifest's reference, `None` when nothing changed.
    pub reference: Option<String>,
    /// Every file the directory holds.
    pub manifest: Manifest,
    /// What those files looked like when they were hashed.
    pub files: LocalFiles,
}

/// How a local file looked (size, modification and change times, inode)
/// when it was hashed, and its hash. A file that still looks exactly so is
/// not read and hashed again: with hundreds of megabytes of workspace, that
/// is the difference between a turn that stats a few files and one that
/// reads all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
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
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The hashes of a directory's files, by relative name, each valid while
/// the file looks as it did (see [`Seen`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalFiles(HashMap<String, Seen>);

impl LocalFiles {
    /// The hash of `name` if `meta` shows it unchanged since it was hashed.
    fn hash_of(&self, name: &str, meta: &std::fs::Metadata) -> Option<FileEntry> {
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
    fn remember(
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
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> WorkspaceResult<T> + Send + 'static,
) -> WorkspaceResult<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| WorkspaceError::Io(std::io::Error::other(format!("workspace task: {e}"))))?
}

#[derive(Clone, Debug)]
pub struct WorkspaceStore {
    store: Arc<dyn ObjectStore>,
    /// `<namespace>/` before every object name, empty in the default
    /// namespace (see [`WorkspaceStore::in_namespace`]).
    prefix: String,
}

/// Where the blob of `hash` lives. A hash that is not 64 lowercase hex
/// digits never came from this code (a hostile or corrupt manifest) and is
/// refused, never used to build a path.
fn blob_path(prefix: &str, hash: &str) -> WorkspaceResult<ObjectPath> {
    let valid = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !valid {
        return Err(WorkspaceError::Corrupt {
            what: hash.chars().take(80).collect(),
            why: "a blob hash must be 64 lowercase hex digits",
        });
    }
    Ok(ObjectPath::from(format!(
        "{prefix}blobs/{}/{hash}",
        &hash[..2]
    )))
}

/// Where the manifest of `version` written under `fence` lives.
pub fn manifest_ref(key: &SessionKey, version: u64, fence: u64) -> String {
    manifest_ref_in("", key, version, fence)
}

fn manifest_ref_in(prefix: &str, key: &SessionKey, version: u64, fence: u64) -> String {
    format!(
        "{prefix}manifests/{}/{}/{version:020}-{fence}.json",
        path_part(key.tenant.as_str()),
        path_part(key.session.as_str())
    )
}

/// Longest file name a workspace holds, in bytes of its `/`-separated
/// path (Linux's `PATH_MAX`), and longest part of it (`NAME_MAX`).
pub const MAX_FILE_NAME_BYTES: usize = 4096;
pub const MAX_FILE_NAME_PART_BYTES: usize = 255;

/// The one rule for a workspace file's name, the `/`-separated path a
/// manifest keys it by: a snapshot stores only names it accepts, and a
/// restore writes only those, so whatever a turn commits the next turn can
/// restore, on any replica. A name is UTF-8 and relative; its parts are
/// not empty, not `.` or `..`, hold no backslash (a separator elsewhere)
/// and no control character (a newline in a name would forge lines in logs
/// and listings), and fit the Linux limits.
pub fn check_file_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("a file name must not be empty");
    }
    if name.len() > MAX_FILE_NAME_BYTES {
        return Err("a file name must be at most 4096 bytes");
    }
    for part in name.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err("a file name must be a plain relative path (no empty, `.` or `..` part)");
        }
        if part.len() > MAX_FILE_NAME_PART_BYTES {
            return Err("each part of a file name must be at most 255 bytes");
        }
        if part.contains('\\') {
            return Err("a file name must not hold a backslash");
        }
        if part.chars().any(char::is_control) {
            return Err("a file name must not hold control characters");
        }
    }
    Ok(())
}

/// The `/`-separated name of `file` inside `root`, refusing one that
/// breaks [`check_file_name`]: the turn fails (AGENT_FAILED, naming the
/// file) and commits nothing, rather than commit a file no replica could
/// restore.
fn relative_name(root: &Path, file: &Path) -> WorkspaceResult<String> {
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
fn local_path(root: &Path, name: &str) -> WorkspaceResult<PathBuf> {
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
fn clear_non_files(root: &Path, name: &str) -> WorkspaceResult<usize> {
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
fn walk(root: &Path) -> WorkspaceResult<Vec<PathBuf>> {
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
fn file_entry(path: &Path, meta: &std::fs::Metadata) -> WorkspaceResult<(FileEntry, Vec<u8>)> {
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
fn compare_local(dir: &Path, manifest: &Manifest) -> WorkspaceResult<LocalComparison> {
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
struct LocalComparison {
    /// Files to download.
    missing: Vec<String>,
    removed: usize,
    unrestorable: Vec<String>,
    files: LocalFiles,
}

/// Content to upload, by blob hash.
type NewBlobs = Vec<(String, Vec<u8>)>;

/// Up to this many files and this many bytes to hash, a snapshot runs on
/// the runtime thread: handing it to the blocking pool and back costs more
/// (two thread wake-ups, measured at about 100 µs of system CPU per turn)
/// than walking a few files. Beyond, it runs on the blocking pool.
const INLINE_FILES: usize = 64;
const INLINE_HASH_BYTES: u64 = 256 * 1024;

/// A snapshot's walk: every file of the directory, and for each the hash
/// remembered for it when it looks unchanged.
struct ScanPlan {
    files: Vec<(String, PathBuf, std::fs::Metadata, Option<FileEntry>)>,
    /// Bytes of the files that must be read and hashed.
    to_hash: u64,
}

/// Walks `dir` and stats its files. Blocking, but cheap for a small
/// workspace.
fn plan_scan(dir: &Path, seen: &LocalFiles) -> WorkspaceResult<ScanPlan> {
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
fn finish_scan(
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
async fn scan_local(
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

impl WorkspaceStore {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            prefix: String::new(),
        }
    }

    /// The same store with every object under `<namespace>/` (encoded like
    /// an id), so deployments sharing a bucket never meet; the empty
    /// namespace is the bucket's root, where objects lived before
    /// namespaces.
    pub fn in_namespace(mut self, namespace: &str) -> Self {
        self.prefix = if namespace.is_empty() {
            String::new()
        } else {
            format!("baton@{}/", path_part(namespace))
        };
        self
    }

    /// An S3-compatible store. Requests time out and retry briefly, so an
    /// unreachable store fails a turn in seconds rather than hanging it.
    pub fn s3(config: &S3Config) -> WorkspaceResult<Self> {
        let store = AmazonS3Builder::new()
            .with_endpoint(&config.endpoint)
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_virtual_hosted_style_request(!config.force_path_style)
            // Client options replace the builder's, allow_http included.
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(config.endpoint.starts_with("http://"))
                    .with_connect_timeout(Duration::from_secs(2))
                    .with_timeout(Duration::from_secs(30)),
            )
            .with_retry(RetryConfig {
                max_retries: 2,
                retry_timeout: Duration::from_secs(5),
                ..RetryConfig::default()
            })
            .build()?;
        Ok(Self::new(Arc::new(store)))
    }

    /// A local directory (the embedded backend).
    pub fn local(dir: &Path) -> WorkspaceResult<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self::new(Arc::new(LocalFileSystem::new_with_prefix(dir)?)))
    }

    pub async fn load_manifest(&self, reference: &str) -> WorkspaceResult<Manifest> {
        let bytes = self
            .store
            .get(&ObjectPath::from(reference))
            .await?
            .bytes()
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| WorkspaceError::BadManifest(reference.into(), e))
    }

    /// The content of file `name` in the version `reference` points to,
    /// `None` when that version has no such file.
    pub async fn read_file(&self, reference: &str, name: &str) -> WorkspaceResult<Option<Bytes>> {
        let manifest = self.load_manifest(reference).await?;
        let Some(entry) = manifest.files.get(name) else {
            return Ok(None);
        };
        Ok(Some(self.fetch_blob(name, entry).await?))
    }

    /// The blob of file `name`, checked against its hash.
    async fn fetch_blob(&self, name: &str, entry: &FileEntry) -> WorkspaceResult<Bytes> {
        let content = self
            .store
            .get(&blob_path(&self.prefix, &entry.blob)?)
            .await?
            .bytes()
            .await?;
        if digest(&content) != entry.blob {
            return Err(WorkspaceError::Corrupt {
                what: name.to_owned(),
                why: "blob content does not match its hash",
            });
        }
        Ok(content)
    }

    /// Makes `dir` hold exactly the files of the version `reference` points
    /// to (an empty workspace for `None`), downloading only the blobs whose
    /// content is not already there.
    pub async fn materialize(
        &self,
        reference: Option<&str>,
        dir: &Path,
    ) -> WorkspaceResult<Materialized> {
        let manifest = match reference {
            Some(r) => self.load_manifest(r).await?,
            None => Manifest::default(),
        };
        let LocalComparison {
            missing,
            removed,
            unrestorable,
            mut files,
        } = {
            let (dir, manifest) = (dir.to_owned(), manifest.clone());
            blocking(move || compare_local(&dir, &manifest)).await?
        };
        if !unrestorable.is_empty() {
            tracing::warn!(
                reference = ?reference,
                files = ?unrestorable,
                "workspace files not restored: their names break the file name rule; the next commit leaves them out"
            );
        }
        let mut fetched = 0;
        for name in missing {
            let entry = &manifest.files[&name];
            let content = self.fetch_blob(&name, entry).await?;
            let path = local_path(dir, &name)?;
            let written = blocking(move || {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let hashed_at = SystemTime::now();
                std::fs::write(&path, &content)?;
                Ok((std::fs::symlink_metadata(&path)?, hashed_at))
            })
            .await?;
            files.remember(&name, &written.0, entry, written.1);
            fetched += 1;
        }
        Ok(Materialized {
            manifest,
            fetched,
            removed,
            unrestorable,
            files,
        })
    }

    /// Stores the files of `dir` as the workspace of `version` written under
    /// `fence`. Returns `None` when nothing changed from `base` (nothing is
    /// written then), else the new manifest's reference. Blobs already
    /// stored are not uploaded again.
    pub async fn snapshot(
        &self,
        dir: &Path,
        base: &Manifest,
        key: &SessionKey,
        version: u64,
        fence: u64,
    ) -> WorkspaceResult<Option<String>> {
        Ok(self
            .snapshot_manifest(dir, base, &LocalFiles::default(), key, version, fence)
            .await?
            .reference)
    }

    /// [`Self::snapshot`], also returning the manifest of what `dir` holds
    /// and how its files looked. Files that look as `seen` remembers them
    /// are not read again.
    pub async fn snapshot_manifest(
        &self,
        dir: &Path,
        base: &Manifest,
        seen: &LocalFiles,
        key: &SessionKey,
        version: u64,
        fence: u64,
    ) -> WorkspaceResult<Snapshot> {
        let (manifest, new_blobs, files) = scan_local(dir, base, seen).await?;
        if manifest == *base {
            return Ok(Snapshot {
                reference: None,
                manifest,
                files,
            });
        }
        for (hash, content) in new_blobs {
            self.put_once(&blob_path(&self.prefix, &hash)?, Bytes::from(content))
                .await?;
        }
        let reference = manifest_ref_in(&self.prefix, key, version, fence);
        let body = serde_json::to_vec(&manifest)
            .map_err(|e| WorkspaceError::BadManifest(reference.clone(), e))?;
        self.put_once(&ObjectPath::from(reference.as_str()), Bytes::from(body))
            .await?;
        Ok(Snapshot {
            reference: Some(reference),
            manifest,
            files,
        })
    }

    /// Writes an object that must never be overwritten. Content-addressed
    /// blobs and fenced manifests are identical when they already exist.
    async fn put_once(&self, path: &ObjectPath, content: Bytes) -> WorkspaceResult<()> {
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self.store.put_opts(path, content.into(), options).await {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Every manifest reference in the store.
    pub async fn list_manifests(&self) -> WorkspaceResult<Vec<String>> {
        let found: Vec<_> = self
            .store
            .list(Some(&ObjectPath::from(format!("{}manifests", self.prefix))))
            .try_collect()
            .await?;
        Ok(found.into_iter().map(|m| m.location.to_string()).collect())
    }

    /// Writes `manifest` as is, for tests of hostile manifests.
    #[doc(hidden)]
    pub async fn put_manifest_for_test(
        &self,
        key: &SessionKey,
        manifest: &Manifest,
    ) -> WorkspaceResult<String> {
        let reference = manifest_ref_in(&self.prefix, key, u64::MAX, 0);
        let body = serde_json::to_vec(manifest)
            .map_err(|e| WorkspaceError::BadManifest(reference.clone(), e))?;
        self.store
            .put(
                &ObjectPath::from(reference.as_str()),
                Bytes::from(body).into(),
            )
            .await?;
        Ok(reference)
    }

    /// Deletes manifests not in `live` and older than `retention`, then the
    /// blobs older than `retention` that no remaining manifest lists, at
    /// once. Safe only while no turn writes to the store (tools, tests):
    /// a turn may reuse an old blob (content addressing) after this listed
    /// the manifests. Replicas use [`Self::collect`].
    pub async fn gc(
        &self,
        live: &HashSet<String>,
        retention: Duration,
    ) -> WorkspaceResult<GcReport> {
        let (manifests, blobs) = self.garbage(live, retention).await?;
        Ok(GcReport {
            manifests_deleted: self.delete_all(&manifests).await?,
            blobs_deleted: self.delete_all(&blobs).await?,
        })
    }

    /// One run of the collector replicas schedule: deletes what was garbage
    /// at the previous run (`previous`) and still is now, and returns what
    /// is garbage now for the next run. Garbage is a manifest not in `live`
    /// (the workspaces of current states and durable copies) and older
    /// than `retention`, or a blob older than `retention` that no other
    /// manifest lists. Two looks, an interval apart, because a turn can
    /// make an old blob live again without writing it (content
    /// addressing: the same file in another session or version) and its
    /// manifest lands only when the turn ends: runs further apart than the
    /// longest turn see that manifest before deleting the blob.
    pub async fn collect(
        &self,
        live: &HashSet<String>,
        retention: Duration,
        previous: &GcCandidates,
    ) -> WorkspaceResult<(GcReport, GcCandidates)> {
        let (manifests, blobs) = self.garbage(live, retention).await?;
        let (manifests_now, manifests_next): (Vec<_>, Vec<_>) = manifests
            .into_iter()
            .partition(|m| previous.manifests.contains(m));
        let (blobs_now, blobs_next): (Vec<_>, Vec<_>) =
            blobs.into_iter().partition(|b| previous.blobs.contains(b));
        let report = GcReport {
            manifests_deleted: self.delete_all(&manifests_now).await?,
            blobs_deleted: self.delete_all(&blobs_now).await?,
        };
        Ok((
            report,
            GcCandidates {
                manifests: manifests_next.into_iter().collect(),
                blobs: blobs_next.into_iter().collect(),
            },
        ))
    }

    /// The manifests not in `live` and older than `retention`, and the blobs
    /// older than `retention` that no other manifest lists.
    async fn garbage(
        &self,
        live: &HashSet<String>,
        retention: Duration,
    ) -> WorkspaceResult<(Vec<String>, Vec<String>)> {
        let cutoff = chrono_cutoff(retention);
        let manifests: Vec<_> = self
            .store
            .list(Some(&ObjectPath::from(format!("{}manifests", self.prefix))))
            .try_collect()
            .await?;
        let mut garbage = Vec::new();
        let mut referenced = HashSet::new();
        for meta in manifests {
            let reference = meta.location.to_string();
            if !live.contains(&reference) && meta.last_modified < cutoff {
                garbage.push(reference);
                continue;
            }
            match self.load_manifest(&reference).await {
                Ok(manifest) => referenced.extend(manifest.files.into_values().map(|e| e.blob)),
                // Deleted since the listing (another collector, a test).
                Err(WorkspaceError::Store(object_store::Error::NotFound { .. })) => {}
                Err(e) => return Err(e),
            }
        }
        let blobs: Vec<_> = self
            .store
            .list(Some(&ObjectPath::from(format!("{}blobs", self.prefix))))
            .try_collect()
            .await?;
        let unreferenced = blobs
            .into_iter()
            .filter(|meta| {
                let hash = meta.location.filename().unwrap_or_default();
                !referenced.contains(hash) && meta.last_modified < cutoff
            })
            .map(|meta| meta.location.to_string())
            .collect();
        Ok((garbage, unreferenced))
    }

    /// Deletes `paths`; one already gone counts as deleted by someone else.
    async fn delete_all(&self, paths: &[String]) -> WorkspaceResult<usize> {
        let mut deleted = 0;
        for path in paths {
            match self.store.delete(&ObjectPath::from(path.as_str())).await {
                Ok(()) => deleted += 1,
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(deleted)
    }
}

/// What one collector run found to be garbage, for the next run to delete
/// if it still is (see [`WorkspaceStore::collect`]). Kept in memory by the
/// one replica that collects; a new collector starts with none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcCandidates {
    pub manifests: HashSet<String>,
    pub blobs: HashSet<String>,
}

fn chrono_cutoff(retention: Duration) -> chrono::DateTime<chrono::Utc> {
    let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    chrono::Utc::now() - retention
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

    #[test]
    fn the_file_name_rule_names_what_it_refuses() {
        for good in ["notes.md", "a/b/c.txt", ".env", "a b", "名字.txt", "x..y"] {
            assert_eq!(check_file_name(good), Ok(()), "{good:?}");
        }
        for (bad, says) in [
            ("x\\y", "backslash"),
            ("", "empty"),
            ("a//b", "plain relative"),
            ("/etc/passwd", "plain relative"),
            ("a/../b", "plain relative"),
            ("./a", "plain relative"),
            ("a\nb", "control"),
            ("a\u{7f}", "control"),
            (&"n".repeat(256), "255 bytes"),
            (&"n/".repeat(2100), "4096 bytes"),
        ] {
            let why = check_file_name(bad).unwrap_err();
            assert!(why.contains(says), "{bad:?}: {why}");
        }
    }

    /// Blob names come from manifests, which a hostile writer may forge:
    /// only a SHA-256 in hex becomes a path.
    #[test]
    fn only_a_sha256_names_a_blob() {
        let good = digest(b"x");
        assert!(blob_path("", &good).is_ok());
        for bad in [
            "",
            "a",
            "ab",
            "../../etc/passwd",
            &good.to_uppercase(),
            &format!("{good}0"),
        ] {
            assert!(blob_path("", bad).is_err(), "{bad:?} accepted");
        }
    }
}
