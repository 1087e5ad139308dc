//! The session directories a replica keeps between turns, so the next
//! turn of a session here skips downloading its files: which generation
//! directory a turn uses, what committed version it holds exactly, and
//! eviction (least recently used first) within a budget of bytes and
//! directories. The turn itself is in [`crate::engine`].

use std::path::PathBuf;

use baton_session::SessionKey;
use baton_session::id_encoding::path_part;
use baton_workspace::{LocalFiles, Manifest};

/// How much the replica keeps of session directories between turns: they
/// spare the next turn of a session the download of its files, and are
/// evicted least recently used first beyond either bound (the pod's
/// workspace volume is finite). An evicted session's next turn here
/// materialises its files from the object store again.
#[derive(Clone, Copy, Debug)]
pub struct LocalBudget {
    /// Bytes of committed files kept (as their manifests count them).
    pub max_bytes: u64,
    pub max_dirs: usize,
}

impl Default for LocalBudget {
    fn default() -> Self {
        Self {
            max_bytes: 2 << 30,
            max_dirs: 10_000,
        }
    }
}

/// This replica's session directories. Each session's files live in
/// `<root>/<tenant>/<session>/g<fence>`, a generation directory the agent
/// is given as `workspaceDir`. A turn whose agent call was abandoned (lease
/// lost, timeout, drain, a broken connection) may have an agent still
/// writing there: that generation is deleted and the next turn starts a new
/// one, so late writes can never reach a later turn's files. Normal turns
/// keep their generation and create nothing (new inodes are expensive on
/// ext4 at thousands of turns per second).
#[derive(Default)]
pub(crate) struct LocalWorkspaces {
    dirs: std::sync::Mutex<Dirs>,
    budget: LocalBudget,
}

#[derive(Default)]
struct Dirs {
    map: std::collections::HashMap<SessionKey, LocalDir>,
    /// Sum of the entries' `bytes`.
    bytes: u64,
    /// Counts uses, for least-recently-used order.
    clock: u64,
}

struct LocalDir {
    dir: PathBuf,
    /// What the directory holds, when a commit of ours left it exactly so;
    /// `None` while a turn uses it.
    holds: Option<Holds>,
    /// Bytes of the files it holds (0 until a commit says).
    bytes: u64,
    used: u64,
}

/// A committed version a session directory holds exactly.
pub(crate) struct Holds {
    pub(crate) reference: Option<String>,
    pub(crate) manifest: Manifest,
    /// How its files looked when hashed, so the next snapshot reads only
    /// the files the agent changed.
    pub(crate) files: LocalFiles,
}

/// A session's directory, the generations' parent.
fn session_base(dir: &std::path::Path) -> &std::path::Path {
    dir.parent().unwrap_or(dir)
}

/// Deletes directories on the blocking pool (a big workspace takes a
/// while), logging what it cannot.
fn remove_dirs(dirs: Vec<PathBuf>) {
    if dirs.is_empty() {
        return;
    }
    tokio::task::spawn_blocking(move || {
        for dir in dirs {
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove a session directory");
            }
        }
    });
}

impl LocalWorkspaces {
    pub(crate) fn new(budget: LocalBudget) -> Self {
        Self {
            dirs: Default::default(),
            budget,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Dirs> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Self::check_out`] for a session this replica has a directory for:
    /// no file system work, so it runs on the runtime thread. `None` when
    /// there is none (then `check_out`, on the blocking pool).
    pub(crate) fn check_out_cached(
        &self,
        key: &SessionKey,
        reference: &Option<String>,
    ) -> Option<(PathBuf, Option<Holds>)> {
        let mut dirs = self.lock();
        dirs.clock += 1;
        let clock = dirs.clock;
        let entry = dirs.map.get_mut(key)?;
        entry.used = clock;
        let holds = entry.holds.take();
        let cached = holds.filter(|h| h.reference == *reference);
        Some((entry.dir.clone(), cached))
    }

    /// The directory for a turn of `key` under `fence`, and the manifest it
    /// holds if that is exactly `reference`'s version (else the turn
    /// materialises it). The caller holds the session's local turn slot.
    /// Blocking (it may delete and create directories).
    pub(crate) fn check_out(
        &self,
        root: &std::path::Path,
        key: &SessionKey,
        fence: u64,
        reference: &Option<String>,
    ) -> std::io::Result<(PathBuf, Option<Holds>)> {
        if let Some(hit) = self.check_out_cached(key, reference) {
            return Ok(hit);
        }
        // Unknown here (first turn since start, or evicted): whatever an
        // earlier process or an abandoned call left goes, and a new
        // generation starts. Encoded ids are plain path components.
        let base = root
            .join(&*path_part(key.tenant.as_str()))
            .join(&*path_part(key.session.as_str()));
        match std::fs::remove_dir_all(&base) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let dir = base.join(format!("g{fence}"));
        std::fs::create_dir_all(&dir)?;
        let mut dirs = self.lock();
        let used = dirs.clock;
        dirs.map.insert(
            key.clone(),
            LocalDir {
                dir: dir.clone(),
                holds: None,
                bytes: 0,
                used,
            },
        );
        let evicted = Self::evict(&mut dirs, self.budget);
        drop(dirs);
        remove_dirs(evicted);
        Ok((dir, None))
    }

    /// After a commit: the directory holds exactly that version; then
    /// idle directories beyond the budget go, least recently used first.
    pub(crate) fn committed(&self, key: &SessionKey, holds: Holds) {
        let mut dirs = self.lock();
        let bytes: u64 = holds.manifest.files.values().map(|f| f.size).sum();
        let Some(entry) = dirs.map.get_mut(key) else {
            return;
        };
        let before = std::mem::replace(&mut entry.bytes, bytes);
        entry.holds = Some(holds);
        dirs.bytes = dirs.bytes - before + bytes;
        let evicted = Self::evict(&mut dirs, self.budget);
        drop(dirs);
        remove_dirs(evicted);
    }

    /// Takes idle entries out, least recently used first, until the
    /// budget holds; returns their session directories to delete. An entry
    /// a turn is using (`holds` is `None`) stays.
    fn evict(dirs: &mut Dirs, budget: LocalBudget) -> Vec<PathBuf> {
        let mut evicted = Vec::new();
        while dirs.bytes > budget.max_bytes || dirs.map.len() > budget.max_dirs {
            let oldest = dirs
                .map
                .iter()
                .filter(|(_, d)| d.holds.is_some())
                .min_by_key(|(_, d)| d.used)
                .map(|(k, _)| k.clone());
            let Some(key) = oldest else { break };
            if let Some(entry) = dirs.map.remove(&key) {
                dirs.bytes -= entry.bytes;
                evicted.push(session_base(&entry.dir).to_path_buf());
            }
        }
        evicted
    }

    /// After an abandoned agent call: the generation is deleted and the
    /// next turn starts a new one.
    pub(crate) fn abandon(&self, key: &SessionKey) {
        let mut dirs = self.lock();
        if let Some(entry) = dirs.map.remove(key) {
            dirs.bytes -= entry.bytes;
            drop(dirs);
            remove_dirs(vec![entry.dir]);
        }
    }

    /// Bytes and directories kept now.
    pub(crate) fn usage(&self) -> (u64, usize) {
        let dirs = self.lock();
        (dirs.bytes, dirs.map.len())
    }
}
