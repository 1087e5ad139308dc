//! One `baton dev` per data directory. Two would share the embedded store,
//! the replica names and their log files without a word; the second is
//! refused instead, naming the first.
//!
//! The lock is an advisory lock on `<data-dir>/baton-dev.lock` (`flock`),
//! held for the life of the process: the kernel releases it on any exit,
//! SIGKILL included, so a lock left by a killed `baton dev` is never in
//! the way. The file holds the holder's pid, for the message.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

/// Held while `baton dev` runs; dropping it releases the directory.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

/// Why the data directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another baton dev (pid {pid}) is running with data directory {dir}: stop it, or run a second one beside it with its own --data-dir and --listen (e.g. --data-dir .baton/dev2 --listen 127.0.0.1:18080)",
        pid = .pid.map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
        dir = .dir.display()
    )]
    Held { pid: Option<u32>, dir: PathBuf },
    #[error("lock file {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DataDirLock {
    /// Takes `dir` for this process, or says who has it.
    pub fn take(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join("baton-dev.lock");
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(LockError::Held {
                    pid: holder.trim().parse().ok(),
                    dir: dir.to_owned(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::take(dir.path()).unwrap();
        let refused = DataDirLock::take(dir.path()).unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        assert!(message.contains("--data-dir"), "{message}");
        drop(first);
        DataDirLock::take(dir.path()).expect("free once the first lets go");
    }
}
