//! The fixed table of images this node can "pull": each image repository
//! maps to a way of running the container as local processes.

use std::path::PathBuf;

/// How the containers of one image repository run on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runner {
    /// The Baton image: `binary` with the container's `command` (its first
    /// word replaced by `binary`, the image's entrypoint) or `args`.
    Baton { binary: PathBuf },
    /// An agent image: the reference agent `binary agent --listen
    /// 0.0.0.0:$BATON_AGENT_PORT` (8080 without it); the container's own
    /// command and args are ignored.
    BatonAgent { binary: PathBuf },
    /// `redis-server` from PATH with the container's args, protected mode
    /// off as in the official image's build.
    Redis,
    /// What the official Postgres image's entrypoint does, with the server
    /// binaries of `bin_dir` (`/usr/lib/postgresql/15/bin`).
    Postgres { bin_dir: PathBuf },
    /// SeaweedFS `weed mini` (from PATH) in place of a MinIO server.
    SeaweedAsMinio,
    /// `curl --aws-sigv4` creating `$BATON_S3_BUCKET` in place of the MinIO
    /// client's `mc mb --ignore-existing`.
    CurlAsMinioClient,
    /// The container's `command` + `args`, run as they are with the host's
    /// programs: for test images such as a shell or Python.
    Host,
}

/// Maps image repositories (tag and digest ignored) to [`Runner`]s.
#[derive(Clone, Debug, Default)]
pub struct ImageTable {
    entries: Vec<(String, Runner)>,
}

/// Repositories of the agent images in `manifests/examples/*.yaml`.
pub const EXAMPLE_AGENT_IMAGES: [&str; 4] = [
    "registry.example.com/travel-planner",
    "ghcr.io/acme/coding-agent",
    "ghcr.io/acme/research-agent",
    "ghcr.io/acme/support-bot",
];

impl ImageTable {
    /// An empty table: every image fails to pull.
    pub fn new() -> Self {
        Self::default()
    }

    /// Baton's images (sidecar and the example agents, run with `baton`),
    /// Redis, Postgres 15, MinIO (as SeaweedFS) and the MinIO client (as
    /// curl).
    pub fn standard(baton: impl Into<PathBuf>) -> Self {
        let binary = baton.into();
        let sidecar = repository(baton_api::constants::images::SIDECAR);
        let mut table = Self::new()
            .with(
                &sidecar,
                Runner::Baton {
                    binary: binary.clone(),
                },
            )
            .with(baton_api::constants::images::REDIS, Runner::Redis)
            .with(
                baton_api::constants::images::POSTGRES,
                Runner::Postgres {
                    bin_dir: PathBuf::from("/usr/lib/postgresql/15/bin"),
                },
            )
            .with(baton_api::constants::images::MINIO, Runner::SeaweedAsMinio)
            .with(
                baton_api::constants::images::MINIO_CLIENT,
                Runner::CurlAsMinioClient,
            );
        for agent in EXAMPLE_AGENT_IMAGES {
            table.insert(
                agent,
                Runner::BatonAgent {
                    binary: binary.clone(),
                },
            );
        }
        table
    }

    /// Adds (or replaces) the runner of `image`'s repository.
    pub fn insert(&mut self, image: &str, runner: Runner) {
        let repo = repository(image);
        self.entries.retain(|(r, _)| *r != repo);
        self.entries.push((repo, runner));
    }

    /// Builder form of [`ImageTable::insert`].
    pub fn with(mut self, image: &str, runner: Runner) -> Self {
        self.insert(image, runner);
        self
    }

    /// The runner of `image`, whatever its tag or digest.
    pub fn lookup(&self, image: &str) -> Option<&Runner> {
        let repo = repository(image);
        self.entries
            .iter()
            .find(|(r, _)| *r == repo)
            .map(|(_, runner)| runner)
    }
}

/// The normalized repository of an image reference: no tag, no digest,
/// Docker Hub's implicit `docker.io/library/` made explicit, so `redis`,
/// `redis:7` and `docker.io/library/redis@sha256:…` are one repository.
pub fn repository(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    let name = match without_digest[last_slash..].find(':') {
        Some(colon) => &without_digest[..last_slash + colon],
        None => without_digest,
    };
    let first = name.split('/').next().unwrap_or_default();
    let has_registry =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        name.to_owned()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_ignore_tags_digests_and_docker_hub_prefixes() {
        assert_eq!(repository("redis"), "docker.io/library/redis");
        assert_eq!(repository("redis:7.2.5"), "docker.io/library/redis");
        assert_eq!(
            repository("docker.io/library/redis@sha256:abc"),
            "docker.io/library/redis"
        );
        assert_eq!(
            repository("minio/mc:RELEASE.2024-08-17T11-33-50Z"),
            "docker.io/minio/mc"
        );
        assert_eq!(
            repository("registry.example.com/travel-planner@sha256:3f4a"),
            "registry.example.com/travel-planner"
        );
        assert_eq!(repository("localhost:5000/x/y:1"), "localhost:5000/x/y");
    }

    #[test]
    fn the_standard_table_knows_baton_and_the_stores() {
        let table = ImageTable::standard("/bin/baton");
        assert!(matches!(
            table.lookup("ghcr.io/baton-dev/baton:9.9.9"),
            Some(Runner::Baton { .. })
        ));
        assert!(matches!(
            table.lookup("ghcr.io/acme/support-bot:1.4.2"),
            Some(Runner::BatonAgent { .. })
        ));
        assert_eq!(table.lookup("redis:6"), Some(&Runner::Redis));
        assert!(matches!(
            table.lookup("postgres:16.4"),
            Some(Runner::Postgres { .. })
        ));
        assert_eq!(
            table.lookup("minio/minio:latest"),
            Some(&Runner::SeaweedAsMinio)
        );
        assert_eq!(table.lookup("minio/mc"), Some(&Runner::CurlAsMinioClient));
        assert_eq!(table.lookup("nginx"), None);
    }
}
