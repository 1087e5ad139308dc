//! Path translation. A process on this node sees the host's filesystem, not
//! the container's, so a path under a container's volumeMount (`/data`,
//! `/workspace/x`) is rewritten to the host directory backing that volume.
//! Applied to whole env values and args, and to the value part of
//! `--flag=/path` / `-flag=/path` args.

use std::path::{Path, PathBuf};

/// Where the mounts [`MountTable::well_known`] returns live.
const WELL_KNOWN_ROOT: &str = "/var/run/secrets/";

/// A container's mounts: container path → host directory.
#[derive(Clone, Debug, Default)]
pub(crate) struct MountTable {
    /// Longest container path first, so nested mounts win.
    mounts: Vec<(String, PathBuf)>,
}

impl MountTable {
    pub fn new(mounts: impl IntoIterator<Item = (String, PathBuf)>) -> Self {
        let mut mounts: Vec<(String, PathBuf)> = mounts
            .into_iter()
            .map(|(c, h)| {
                let trimmed = c.trim_end_matches('/');
                (
                    if trimmed.is_empty() {
                        "/".into()
                    } else {
                        trimmed.into()
                    },
                    h,
                )
            })
            .collect();
        mounts.sort_by_key(|(c, _)| std::cmp::Reverse(c.len()));
        Self { mounts }
    }

    /// The host path of `container_path` if it is equal to or under a
    /// mount.
    pub fn host_path(&self, container_path: &str) -> Option<PathBuf> {
        self.mounts.iter().find_map(|(mount, host)| {
            if container_path == mount {
                Some(host.clone())
            } else {
                let rest = if mount == "/" {
                    container_path.strip_prefix('/')
                } else {
                    container_path
                        .strip_prefix(mount.as_str())?
                        .strip_prefix('/')
                }?;
                Some(host.join(rest))
            }
        })
    }

    /// `value` with a container path replaced by its host path.
    pub fn translate(&self, value: &str) -> String {
        if let Some(host) = self.host_path(value) {
            return host.display().to_string();
        }
        if value.starts_with('-')
            && let Some((flag, path)) = value.split_once('=')
            && let Some(host) = self.host_path(path)
        {
            return format!("{flag}={}", host.display());
        }
        value.to_owned()
    }

    /// Mounts at fixed well-known paths that programs open without being
    /// told (a Kubernetes client reads its service-account token from
    /// `/var/run/secrets/kubernetes.io/serviceaccount`): translation cannot
    /// reach them, so they are bind-mounted for real in the process's own
    /// mount namespace (see `process::command`).
    pub fn well_known(&self) -> Vec<(PathBuf, String)> {
        self.mounts
            .iter()
            .filter(|(c, _)| c.starts_with(WELL_KNOWN_ROOT))
            .map(|(c, h)| (h.clone(), c.clone()))
            .collect()
    }

    /// The host directory mounted exactly at `container_path`, if any.
    pub fn mounted_at(&self, container_path: &str) -> Option<&Path> {
        self.mounts
            .iter()
            .find(|(c, _)| c == container_path.trim_end_matches('/'))
            .map(|(_, h)| h.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_mounts_become_host_paths() {
        let table = MountTable::new([
            ("/data".to_owned(), PathBuf::from("/h/pv")),
            ("/data/cache/".to_owned(), PathBuf::from("/h/cache")),
            ("/workspace".to_owned(), PathBuf::from("/h/ws")),
        ]);
        assert_eq!(table.translate("/data"), "/h/pv");
        assert_eq!(table.translate("/data/"), "/h/pv/");
        assert_eq!(table.translate("/data/pgdata"), "/h/pv/pgdata");
        assert_eq!(table.translate("/data/cache/x"), "/h/cache/x");
        assert_eq!(table.translate("/database"), "/database");
        assert_eq!(table.translate("--dir=/workspace/a"), "--dir=/h/ws/a");
        assert_eq!(table.translate("-dir=/data"), "-dir=/h/pv");
        assert_eq!(table.translate("name=/data"), "name=/data");
        assert_eq!(table.translate("yes"), "yes");
        assert_eq!(table.mounted_at("/workspace/"), Some(Path::new("/h/ws")));
    }
}
