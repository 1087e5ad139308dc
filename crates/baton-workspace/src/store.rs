//! The object store side: manifests and blobs, snapshot and materialise.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, PutMode, PutOptions, RetryConfig};

use baton_session::id_encoding::path_part;
use baton_session::ids::SessionKey;
use baton_session::turn_record::digest;

use crate::LocalFiles;
use crate::local::{LocalComparison, blocking, compare_local, local_path, scan_local};
use crate::names::{blob_path, manifest_ref_in};
use crate::{
    FileEntry, Manifest, Materialized, S3Config, Snapshot, WorkspaceError, WorkspaceResult,
};

#[derive(Clone, Debug)]
pub struct WorkspaceStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// `<namespace>/` before every object name, empty in the default
    /// namespace (see [`WorkspaceStore::in_namespace`]).
    pub(crate) prefix: String,
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
}
