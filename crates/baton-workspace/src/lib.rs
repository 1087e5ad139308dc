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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

#[cfg(feature = "cli")]
pub mod cli;
pub mod collector;
mod gc;
mod local;
mod names;
mod store;

pub use gc::GcCandidates;
pub use local::LocalFiles;
pub use names::{MAX_FILE_NAME_BYTES, MAX_FILE_NAME_PART_BYTES, check_file_name, manifest_ref};
pub use store::WorkspaceStore;
