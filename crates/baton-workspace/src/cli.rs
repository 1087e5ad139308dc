//! Command-line settings shared by every process that opens the workspace
//! store (the sidecar, the dashboard): one source for their flags, help
//! texts and environment variables (the names `baton-api`'s constants
//! give the operator's pods). Feature `cli`.

use std::path::PathBuf;

use crate::{S3Config, WorkspaceResult, WorkspaceStore};

/// An S3-compatible object store (the workspace store of the sidecar,
/// the dashboard and `baton dev`).
#[derive(clap::Args, Clone, Debug)]
pub struct S3Args {
    /// S3-compatible endpoint of the workspace store; without it, workspaces
    /// are kept in a local directory.
    #[arg(long, env = "BATON_S3_ENDPOINT", hide_env_values = true)]
    pub s3_endpoint: Option<String>,

    /// Bucket of the workspace store.
    #[arg(
        long,
        env = "BATON_S3_BUCKET",
        default_value = "baton",
        hide_env_values = true
    )]
    pub s3_bucket: String,

    /// Region the S3 requests are signed for.
    #[arg(
        long,
        env = "BATON_S3_REGION",
        default_value = "us-east-1",
        hide_env_values = true
    )]
    pub s3_region: String,

    /// Access key id of the S3 store (unset: anonymous).
    #[arg(long, env = "BATON_S3_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,

    /// Secret access key of the S3 store.
    #[arg(long, env = "BATON_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<String>,

    /// Path-style addressing (MinIO, SeaweedFS).
    #[arg(long, env = "BATON_S3_FORCE_PATH_STYLE", default_value_t = true, action = clap::ArgAction::Set, hide_env_values = true)]
    pub s3_force_path_style: bool,
}

impl S3Args {
    /// The store's settings, when an endpoint is given.
    pub fn config(&self) -> Option<S3Config> {
        let endpoint = self.s3_endpoint.clone()?;
        Some(S3Config {
            endpoint,
            bucket: self.s3_bucket.clone(),
            region: self.s3_region.clone(),
            access_key_id: self.s3_access_key_id.clone().unwrap_or_default(),
            secret_access_key: self.s3_secret_access_key.clone().unwrap_or_default(),
            force_path_style: self.s3_force_path_style,
        })
    }

    /// The same settings as `baton sidecar` flags and environment, for a
    /// process started with them (the credentials in the environment, not
    /// on its command line).
    pub fn pass_to(&self, cmd: &mut tokio::process::Command) {
        if let Some(endpoint) = &self.s3_endpoint {
            cmd.arg("--s3-endpoint")
                .arg(endpoint)
                .arg("--s3-bucket")
                .arg(&self.s3_bucket)
                .arg("--s3-region")
                .arg(&self.s3_region)
                .arg(format!(
                    "--s3-force-path-style={}",
                    self.s3_force_path_style
                ));
            if let Some(key) = &self.s3_access_key_id {
                cmd.env("BATON_S3_ACCESS_KEY_ID", key);
            }
            if let Some(secret) = &self.s3_secret_access_key {
                cmd.env("BATON_S3_SECRET_ACCESS_KEY", secret);
            }
        }
    }
}

/// Where workspace files live: an S3-compatible store, or a directory.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkspaceArgs {
    #[command(flatten)]
    pub s3: S3Args,

    /// Local object directory for workspaces when no S3 endpoint is set.
    #[arg(
        long,
        env = "BATON_OBJECTS_DIR",
        default_value = ".baton/objects",
        hide_env_values = true
    )]
    pub objects_dir: PathBuf,
}

impl WorkspaceArgs {
    /// The store, in the deployment's store namespace.
    pub fn open(&self, namespace: &str) -> WorkspaceResult<WorkspaceStore> {
        let store = match self.s3.config() {
            Some(config) => WorkspaceStore::s3(&config)?,
            None => WorkspaceStore::local(&self.objects_dir)?,
        };
        Ok(store.in_namespace(namespace))
    }

    /// Which store, for logs and banners (no credentials).
    pub fn describe(&self) -> String {
        match &self.s3.s3_endpoint {
            Some(e) => format!("S3 {e}/{}", self.s3.s3_bucket),
            None => format!("directory {}", self.objects_dir.display()),
        }
    }
}
