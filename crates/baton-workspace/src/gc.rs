//! Collecting the manifests and blobs no state refers to any more.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use crate::WorkspaceStore;
use crate::{GcReport, WorkspaceError, WorkspaceResult};

impl WorkspaceStore {
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
