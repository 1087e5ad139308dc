//! Command-line settings shared by every process that opens the workspace
//! store (the sidecar, the dashboard): one source for their flags, help
//! texts and environment variables (the names `baton-api`'s constants
//! give the operator's pods). Feature `cli`.

use std::path::PathBuf;

use crate::workspace::{S3Config, WorkspaceResult, WorkspaceStore};

/// Where workspace files live: an S3-compatible store, or a directory.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkspaceArgs {
    /// S3-compatible endpoint of the workspace store; without it, workspaces
    /// are kept in `--objects-dir`.
    #[arg(long, env = "BATON_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,

    /// Bucket of the workspace store.
    #[arg(long, env = "BATON_S3_BUCKET", default_value = "baton")]
    pub s3_bucket: String,

    /// Region the S3 requests are signed for.
    #[arg(long, env = "BATON_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,

    /// Access key id of the S3 store.
    #[arg(
        long,
        env = "BATON_S3_ACCESS_KEY_ID",
        default_value = "",
        hide_env_values = true
    )]
    pub s3_access_key_id: String,

    /// Secret access key of the S3 store.
    #[arg(
        long,
        env = "BATON_S3_SECRET_ACCESS_KEY",
        default_value = "",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub s3_secret_access_key: String,

    /// Path-style addressing (MinIO, SeaweedFS).
    #[arg(long, env = "BATON_S3_FORCE_PATH_STYLE", default_value_t = true, action = clap::ArgAction::Set)]
    pub s3_force_path_style: bool,

    /// Local object directory for workspaces when no S3 endpoint is set.
    #[arg(long, env = "BATON_OBJECTS_DIR", default_value = ".baton/objects")]
    pub objects_dir: PathBuf,
}

impl WorkspaceArgs {
    /// The store, in the deployment's store namespace.
    pub fn open(&self, namespace: &str) -> WorkspaceResult<WorkspaceStore> {
        let store = match &self.s3_endpoint {
            Some(endpoint) => WorkspaceStore::s3(&S3Config {
                endpoint: endpoint.clone(),
                bucket: self.s3_bucket.clone(),
                region: self.s3_region.clone(),
                access_key_id: self.s3_access_key_id.clone(),
                secret_access_key: self.s3_secret_access_key.clone(),
                force_path_style: self.s3_force_path_style,
            })?,
            None => WorkspaceStore::local(&self.objects_dir)?,
        };
        Ok(store.in_namespace(namespace))
    }

    /// Which store, for logs and banners (no credentials).
    pub fn describe(&self) -> String {
        match &self.s3_endpoint {
            Some(e) => format!("S3 {e}/{}", self.s3_bucket),
            None => format!("directory {}", self.objects_dir.display()),
        }
    }
}
