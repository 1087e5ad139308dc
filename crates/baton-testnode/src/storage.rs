//! The node's volume provisioner: a Pending PersistentVolumeClaim (a
//! StatefulSet's volumeClaimTemplate, say) gets a hostPath
//! PersistentVolume, a directory under `work_dir/volumes/`, pre-bound to it
//! with a `claimRef`; kube-controller-manager's PV controller then binds the
//! claim. The volume is `Retain`ed: like a real disk, its data outlives the
//! pods that used it.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

/// Label on every volume this node provisioned.
pub const PROVISIONED_BY: &str = "baton.dev/test-node";

/// Whether `pvc` waits for a volume this node should provide.
pub(crate) fn needs_volume(pvc: &PersistentVolumeClaim) -> bool {
    let pending = pvc
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_none_or(|p| p == "Pending");
    let unbound = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_none_or(str::is_empty);
    pending && unbound && pvc.metadata.deletion_timestamp.is_none()
}

/// Creates the PersistentVolume for `pvc` (an existing one is fine).
pub(crate) async fn provision(
    client: &kube::Client,
    node: &str,
    work_dir: &Path,
    pvc: &PersistentVolumeClaim,
) -> anyhow::Result<()> {
    let namespace = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let spec = pvc.spec.clone().unwrap_or_default();
    let dir = work_dir
        .join("volumes")
        .join(format!("{namespace}_{name}_{uid}"));
    crate::volumes::create_open_dir(&dir)?;
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let access_modes = spec
        .access_modes
        .clone()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| vec!["ReadWriteOnce".into()]);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pvc-{uid}"),
            "labels": BTreeMap::from([(PROVISIONED_BY, node)]),
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": access_modes,
            "hostPath": {"path": dir.display().to_string(), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": name,
                "uid": uid,
            },
            // The claim's class, even a StorageClass that does not exist:
            // the PV controller binds only volumes of the claim's class.
            "storageClassName": spec.storage_class_name.clone().unwrap_or_default(),
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "persistentVolumeReclaimPolicy": "Retain",
        },
    }))?;
    match Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
    {
        Ok(_) => {
            tracing::info!(claim = %format!("{namespace}/{name}"), dir = %dir.display(), "provisioned a hostPath volume");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
