//! A pod's directories on this node and the host directory behind each of
//! its volumes: emptyDir (a fresh directory per pod), persistentVolumeClaim
//! (the hostPath of the bound PersistentVolume, so data outlives the pod),
//! hostPath, configMap / secret (their keys written as files once, at
//! pod start), and projected volumes of those plus downwardAPI and
//! serviceAccountToken (a real token from the TokenRequest API, bound to
//! the pod; written once, not refreshed: tests are shorter than its hour).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, ProjectedVolumeSource, ServiceAccount,
    ServiceAccountTokenProjection,
};
use kube::Api;
use kube::api::PostParams;

use crate::env::Sources;

/// Where a pod's files live: `work_dir/pods/<ns>_<pod>/` keeps the
/// containers' logs (appended across restarts and re-creations of a pod
/// with the same name); `…/<uid>/` holds this incarnation's emptyDirs and
/// working directories and is removed when the pod is deleted.
#[derive(Clone, Debug)]
pub(crate) struct PodDirs {
    pub root: PathBuf,
    pub incarnation: PathBuf,
}

impl PodDirs {
    pub fn new(work_dir: &Path, namespace: &str, name: &str, uid: &str) -> Self {
        let root = pod_root(work_dir, namespace, name);
        let incarnation = root.join(uid);
        Self { root, incarnation }
    }

    pub fn log(&self, container: &str) -> PathBuf {
        self.root.join(format!("{container}.log"))
    }

    /// The container's working directory, HOME and default TMPDIR parent.
    pub fn container(&self, container: &str) -> PathBuf {
        self.incarnation.join("containers").join(container)
    }

    fn volume(&self, volume: &str) -> PathBuf {
        self.incarnation.join("volumes").join(volume)
    }
}

/// `work_dir/pods/<ns>_<pod>`
pub fn pod_root(work_dir: &Path, namespace: &str, name: &str) -> PathBuf {
    work_dir.join("pods").join(format!("{namespace}_{name}"))
}

/// Why volumes are not ready (the pod stays in ContainerCreating).
pub(crate) type NotReady = String;

/// Creates directories, waits for claims to be bound and returns the host
/// directory of every volume by name.
pub(crate) async fn prepare(
    client: &kube::Client,
    pod: &Pod,
    dirs: &PodDirs,
) -> Result<HashMap<String, PathBuf>, NotReady> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut sources = Sources::new(client.clone(), &namespace);
    let mut out = HashMap::new();
    create_open_dir(&dirs.root).map_err(|e| format!("creating {}: {e}", dirs.root.display()))?;
    create_open_dir(&dirs.incarnation)
        .map_err(|e| format!("creating {}: {e}", dirs.incarnation.display()))?;
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for volume in volumes {
        let dir = if volume.empty_dir.is_some() {
            let dir = dirs.volume(&volume.name);
            create_open_dir(&dir).map_err(|e| format!("emptyDir {}: {e}", volume.name))?;
            dir
        } else if let Some(claim) = &volume.persistent_volume_claim {
            claim_dir(client, &namespace, &claim.claim_name).await?
        } else if let Some(host) = &volume.host_path {
            let dir = PathBuf::from(&host.path);
            if matches!(host.type_.as_deref(), Some("DirectoryOrCreate")) {
                create_open_dir(&dir).map_err(|e| format!("hostPath {}: {e}", host.path))?;
            }
            dir
        } else if let Some(cm) = &volume.config_map {
            let data = sources
                .config_map(&cm.name)
                .await
                .map_err(|e| e.to_string())?
                .cloned();
            let dir = dirs.volume(&volume.name);
            write_source(
                &dir,
                "configmap",
                &cm.name,
                data,
                cm.items.as_deref(),
                cm.optional,
            )?;
            dir
        } else if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            let data = sources
                .secret(&name)
                .await
                .map_err(|e| e.to_string())?
                .cloned();
            let dir = dirs.volume(&volume.name);
            write_source(
                &dir,
                "secret",
                &name,
                data,
                secret.items.as_deref(),
                secret.optional,
            )?;
            dir
        } else if let Some(projected) = &volume.projected {
            let dir = dirs.volume(&volume.name);
            write_projected(client, pod, &mut sources, projected, &dir).await?;
            dir
        } else {
            // Other types (CSI, ephemeral, …): an empty directory stands in.
            tracing::debug!(volume = %volume.name, "unsupported volume type; an empty directory stands in");
            let dir = dirs.volume(&volume.name);
            create_open_dir(&dir).map_err(|e| format!("volume {}: {e}", volume.name))?;
            dir
        };
        out.insert(volume.name.clone(), dir);
    }
    Ok(out)
}

/// Writes every source of a projected volume into `dir`.
async fn write_projected(
    client: &kube::Client,
    pod: &Pod,
    sources: &mut Sources,
    projected: &ProjectedVolumeSource,
    dir: &Path,
) -> Result<(), NotReady> {
    create_open_dir(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for source in projected.sources.iter().flatten() {
        if let Some(token) = &source.service_account_token {
            let value = service_account_token(client, pod, token).await?;
            let file: BTreeMap<String, String> = BTreeMap::from([(token.path.clone(), value)]);
            write_keys(dir, &file, None)?;
        }
        if let Some(cm) = &source.config_map {
            let data = sources
                .config_map(&cm.name)
                .await
                .map_err(|e| e.to_string())?
                .cloned();
            write_source(
                dir,
                "configmap",
                &cm.name,
                data,
                cm.items.as_deref(),
                cm.optional,
            )?;
        }
        if let Some(secret) = &source.secret {
            let data = sources
                .secret(&secret.name)
                .await
                .map_err(|e| e.to_string())?
                .cloned();
            write_source(
                dir,
                "secret",
                &secret.name,
                data,
                secret.items.as_deref(),
                secret.optional,
            )?;
        }
        if let Some(downward) = &source.downward_api {
            let facts = crate::env::PodFacts {
                pod,
                pod_ip: None,
                host_ip: std::net::Ipv4Addr::UNSPECIFIED,
            };
            let mut files = BTreeMap::new();
            for item in downward.items.iter().flatten() {
                let Some(field) = &item.field_ref else {
                    return Err(format!(
                        "downwardAPI item {:?}: only fieldRef is supported by the test node",
                        item.path
                    ));
                };
                let value = crate::env::field_value(&field.field_path, &facts).map_err(|e| e.0)?;
                files.insert(item.path.clone(), value);
            }
            write_keys(dir, &files, None)?;
        }
    }
    Ok(())
}

/// A token of the pod's ServiceAccount, bound to the pod, as a kubelet
/// requests it.
async fn service_account_token(
    client: &kube::Client,
    pod: &Pod,
    source: &ServiceAccountTokenProjection,
) -> Result<String, NotReady> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: source.audience.iter().cloned().collect(),
            expiration_seconds: source.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("requesting a token for serviceaccount {account:?}: {e}"))?;
    answer
        .status
        .map(|s| s.token)
        .ok_or_else(|| format!("the token request for serviceaccount {account:?} has no status"))
}

/// The directory of a bound claim's PersistentVolume.
async fn claim_dir(
    client: &kube::Client,
    namespace: &str,
    claim: &str,
) -> Result<PathBuf, NotReady> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let pvc = claims
        .get_opt(claim)
        .await
        .map_err(|e| format!("reading persistentvolumeclaim {claim:?}: {e}"))?
        .ok_or_else(|| format!("persistentvolumeclaim {claim:?} not found"))?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
    let (true, Some(volume)) = (bound, volume) else {
        return Err(format!("persistentvolumeclaim {claim:?} is not bound yet"));
    };
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .map_err(|e| format!("reading persistentvolume {volume:?}: {e}"))?;
    let path = pv
        .spec
        .and_then(|s| s.host_path)
        .map(|h| PathBuf::from(h.path))
        .ok_or_else(|| format!("persistentvolume {volume:?} is not a hostPath volume"))?;
    create_open_dir(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    Ok(path)
}

/// Writes the keys of a ConfigMap's or Secret's `data` (`None`: it does not
/// exist, which only an optional source may) into `dir`.
fn write_source(
    dir: &Path,
    kind: &str,
    name: &str,
    data: Option<BTreeMap<String, String>>,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
) -> Result<(), NotReady> {
    match data {
        Some(data) => write_keys(dir, &data, items),
        None if optional == Some(true) => write_keys(dir, &BTreeMap::new(), None),
        None => Err(format!("{kind} {name:?} not found")),
    }
}

/// Writes `data`'s keys (or the selected `items`) as files into `dir`.
fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, String>,
    items: Option<&[KeyToPath]>,
) -> Result<(), NotReady> {
    create_open_dir(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let files: Vec<(String, &String)> = match items {
        Some(items) => items
            .iter()
            .filter_map(|i| data.get(&i.key).map(|v| (i.path.clone(), v)))
            .collect(),
        None => data.iter().map(|(k, v)| (k.clone(), v)).collect(),
    };
    for (path, value) in files {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&file, value).map_err(|e| format!("writing {}: {e}", file.display()))?;
    }
    Ok(())
}

/// Creates `dir` readable and writable by everyone: containers of other
/// users (Postgres runs as `postgres`) must be able to use pod volumes,
/// as with an emptyDir's 0777.
pub(crate) fn create_open_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}
