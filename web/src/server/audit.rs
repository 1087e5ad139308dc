//! Every action, who did it and how it ended: a log line, the audit page,
//! and (with a path) one JSON line per action appended to a file that
//! outlives the process; the page shows the newest first.

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::model::AuditEntry;

/// Entries the page shows (and memory keeps).
pub const KEPT: usize = 500;

pub struct Audit {
    file: Option<PathBuf>,
    entries: Mutex<VecDeque<AuditEntry>>,
}

impl Audit {
    /// Keeps entries in memory only.
    pub fn in_memory() -> Self {
        Self {
            file: None,
            entries: Mutex::default(),
        }
    }

    /// Appends to `path`, and starts with the newest entries already there
    /// (a line that is not an entry is skipped with a warning).
    pub fn at(path: PathBuf) -> Result<Self, String> {
        let mut entries = VecDeque::new();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for (n, line) in text.lines().enumerate() {
                    match serde_json::from_str::<AuditEntry>(line) {
                        Ok(entry) => entries.push_back(entry),
                        Err(e) => tracing::warn!(
                            file = %path.display(), line = n + 1, error = %e,
                            "audit log: skipping a line that is not an entry"
                        ),
                    }
                    if entries.len() > KEPT {
                        entries.pop_front();
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("audit log {}: {e}", path.display())),
        }
        // A file an older build created readable by all becomes the
        // operators' only.
        if path.exists() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("audit log {}: {e}", path.display()))?;
        }
        Ok(Self {
            file: Some(path),
            entries: Mutex::new(entries),
        })
    }

    /// Records one action and returns it with its id.
    pub fn record(
        &self,
        who: &str,
        action: &str,
        target: &str,
        outcome: Result<String, String>,
    ) -> AuditEntry {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (ok, detail) = match outcome {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        let entry = AuditEntry {
            id: entries.back().map_or(1, |e| e.id + 1),
            at_ms: crate::server::now_ms(),
            who: who.to_owned(),
            action: action.to_owned(),
            target: target.to_owned(),
            ok,
            detail,
        };
        tracing::info!(
            audit = entry.id, who, action, target, ok, detail = %entry.detail,
            "dashboard action"
        );
        if let Some(path) = &self.file {
            use std::os::unix::fs::OpenOptionsExt as _;
            // Who did what to which session is for the operators only.
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .and_then(|mut f| {
                    let line = serde_json::to_string(&entry).map_err(std::io::Error::other)?;
                    writeln!(f, "{line}")
                });
            if let Err(e) = appended {
                tracing::error!(file = %path.display(), error = %e, "audit log: append failed");
            }
        }
        entries.push_back(entry.clone());
        if entries.len() > KEPT {
            entries.pop_front();
        }
        entry
    }

    /// Newest first.
    pub fn entries(&self) -> Vec<AuditEntry> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_outlive_the_process_in_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::at(path.clone()).unwrap();
        audit.record("ops", "drain", "replica-1", Ok("draining".into()));
        audit.record("ops", "takeover", "acme/s-1", Err("no replica".into()));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"not json\n")
            .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let again = Audit::at(path.clone()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "an older file is made private: {mode:o}"
        );
        let entries = again.entries();
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[0].id, entries[0].ok), (2, false));
        assert_eq!(entries[1].target, "replica-1");
        assert_eq!(again.record("ops", "drain", "r", Ok(String::new())).id, 3);
    }
}
