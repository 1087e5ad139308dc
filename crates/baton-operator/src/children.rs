//! Pure decisions about child objects: when to apply one, and which to prune.
//!
//! A resync must write nothing when nothing changed. Server-side apply of an
//! unchanged object does not change it, but it is still a write request, so
//! the operator applies a child only when [`needs_apply`] says so: the object
//! is missing, what we would apply differs from what we last applied (a hash
//! kept in an annotation), or someone else has edited it since.

use std::collections::{BTreeSet, HashMap};

use baton_api::constants::{FIELD_MANAGER, annotations};
use baton_resources::{ChildKind, ChildObject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

/// Identifies a child within its namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChildKey {
    pub kind: ChildKind,
    pub name: String,
}

impl ChildKey {
    pub fn of(object: &ChildObject) -> Self {
        Self {
            kind: object.kind(),
            name: object.name().to_owned(),
        }
    }
}

impl std::fmt::Display for ChildKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// Hash of the object as built (before the hash annotation is added).
pub fn applied_hash(object: &ChildObject) -> String {
    let bytes = serde_json::to_vec(object).expect("built objects serialise");
    let digest = Sha256::digest(&bytes);
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// The object to apply: the built one carrying its hash annotation.
pub fn with_applied_hash(mut object: ChildObject) -> (ChildObject, String) {
    let hash = applied_hash(&object);
    object
        .metadata_mut()
        .annotations
        .get_or_insert_default()
        .insert(annotations::APPLIED_HASH.to_owned(), hash.clone());
    (object, hash)
}

/// Resource versions the operator has seen in sync with what it applies,
/// keyed by uid. In memory only: after a restart every child is checked once
/// more through its managed fields.
#[derive(Debug, Default)]
pub struct Verified(HashMap<String, String>);

impl Verified {
    pub fn record(&mut self, meta: &ObjectMeta) {
        if let (Some(uid), Some(rv)) = (&meta.uid, &meta.resource_version) {
            self.0.insert(uid.clone(), rv.clone());
        }
    }

    fn is_current(&self, meta: &ObjectMeta) -> bool {
        match (&meta.uid, &meta.resource_version) {
            (Some(uid), Some(rv)) => self.0.get(uid) == Some(rv),
            _ => false,
        }
    }

    pub fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

/// Whether `live` (the child as the cluster has it) must be applied again to
/// become what the operator built (whose hash is `desired_hash`).
pub fn needs_apply(live: Option<&ObjectMeta>, desired_hash: &str, verified: &Verified) -> bool {
    let Some(live) = live else {
        return true;
    };
    let applied = live
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::APPLIED_HASH));
    if applied.map(String::as_str) != Some(desired_hash) {
        return true;
    }
    if verified.is_current(live) {
        return false;
    }
    edited_by_others_since_our_apply(live)
}

/// True when another manager changed the object's main resource (not its
/// status) after our last apply, or when we have no apply on record.
fn edited_by_others_since_our_apply(live: &ObjectMeta) -> bool {
    let entries = live.managed_fields.as_deref().unwrap_or_default();
    let main_resource =
        |e: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
            e.subresource.as_deref().unwrap_or_default().is_empty()
        };
    let ours = entries.iter().filter(main_resource).find(|e| {
        e.manager.as_deref() == Some(FIELD_MANAGER) && e.operation.as_deref() == Some("Apply")
    });
    let Some(ours) = ours else {
        return true;
    };
    entries
        .iter()
        .filter(main_resource)
        .filter(|e| e.manager.as_deref() != Some(FIELD_MANAGER))
        .any(|e| match (&e.time, &ours.time) {
            (Some(theirs), Some(mine)) => theirs.0 > mine.0,
            _ => true,
        })
}

/// Whether `meta` names the resource with `owner_uid` as its controller.
pub fn controlled_by(meta: &ObjectMeta, owner_uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == owner_uid)
}

/// The live children (kind and metadata) controlled by `owner_uid` that the
/// desired state no longer has, in reverse apply order (a StatefulSet goes
/// before the Secret its pods read).
pub fn to_prune<'a>(
    live: impl IntoIterator<Item = (ChildKind, &'a ObjectMeta)>,
    owner_uid: &str,
    desired: &BTreeSet<ChildKey>,
) -> Vec<ChildKey> {
    let mut prune: Vec<ChildKey> = live
        .into_iter()
        .filter(|(_, meta)| controlled_by(meta, owner_uid) && meta.deletion_timestamp.is_none())
        .map(|(kind, meta)| ChildKey {
            kind,
            name: meta.name.clone().unwrap_or_default(),
        })
        .filter(|key| !desired.contains(key))
        .collect();
    // The reverse of the apply order: what refers to others goes first.
    prune.sort_by_key(|key| std::cmp::Reverse(key.kind));
    prune
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        ManagedFieldsEntry, OwnerReference, Time,
    };
    use k8s_openapi::jiff::Timestamp;

    fn config_map(data: &str) -> ChildObject {
        ChildObject::ConfigMap(ConfigMap {
            metadata: ObjectMeta {
                name: Some("bot-config".into()),
                ..ObjectMeta::default()
            },
            data: Some([("k".to_owned(), data.to_owned())].into()),
            ..ConfigMap::default()
        })
    }

    fn entry(
        manager: &str,
        operation: &str,
        second: i64,
        subresource: Option<&str>,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            time: Some(Time(Timestamp::from_second(second).unwrap())),
            subresource: subresource.map(Into::into),
            ..ManagedFieldsEntry::default()
        }
    }

    fn live(hash: &str, fields: Vec<ManagedFieldsEntry>) -> ObjectMeta {
        ObjectMeta {
            uid: Some("u1".into()),
            resource_version: Some("7".into()),
            annotations: Some([(annotations::APPLIED_HASH.to_owned(), hash.to_owned())].into()),
            managed_fields: Some(fields),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_hash_follows_the_content_and_ignores_its_own_annotation() {
        let (applied, hash) = with_applied_hash(config_map("a"));
        assert_eq!(applied_hash(&config_map("a")), hash);
        assert_ne!(applied_hash(&config_map("b")), hash);
        assert_eq!(
            applied.metadata().annotations.as_ref().unwrap()[annotations::APPLIED_HASH],
            hash
        );
    }

    #[test]
    fn an_unchanged_child_is_not_applied_again() {
        let meta = live("h", vec![entry(FIELD_MANAGER, "Apply", 100, None)]);
        assert!(!needs_apply(Some(&meta), "h", &Verified::default()));
        // A status writer is not an edit.
        let meta = live(
            "h",
            vec![
                entry(FIELD_MANAGER, "Apply", 100, None),
                entry("kube-controller-manager", "Update", 200, Some("status")),
            ],
        );
        assert!(!needs_apply(Some(&meta), "h", &Verified::default()));
    }

    #[test]
    fn missing_changed_or_edited_children_are_applied() {
        let verified = Verified::default();
        assert!(needs_apply(None, "h", &verified));
        let ours = entry(FIELD_MANAGER, "Apply", 100, None);
        assert!(needs_apply(
            Some(&live("old", vec![ours.clone()])),
            "h",
            &verified
        ));
        let edited = live(
            "h",
            vec![ours.clone(), entry("kubectl-edit", "Update", 101, None)],
        );
        assert!(needs_apply(Some(&edited), "h", &verified));
        // No apply of ours on record (created by someone else, or fields stripped).
        assert!(needs_apply(Some(&live("h", vec![])), "h", &verified));
    }

    #[test]
    fn an_edit_already_reconciled_is_not_applied_again() {
        let edited = live(
            "h",
            vec![
                entry(FIELD_MANAGER, "Apply", 100, None),
                entry("kubectl-label", "Update", 101, None),
            ],
        );
        let mut verified = Verified::default();
        verified.record(&edited);
        assert!(!needs_apply(Some(&edited), "h", &verified));
        let mut newer = edited.clone();
        newer.resource_version = Some("8".into());
        assert!(needs_apply(Some(&newer), "h", &verified));
    }

    #[test]
    fn prune_takes_only_own_children_that_are_no_longer_desired() {
        let owned = |name: &str, uid: &str| ObjectMeta {
            name: Some(name.into()),
            owner_references: Some(vec![OwnerReference {
                uid: uid.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        };
        let (a, b, c, d) = (
            owned("bot-redis", "u1"),
            owned("bot", "u1"),
            owned("other-redis", "u2"),
            owned("bot-redis", "u1"),
        );
        let desired = BTreeSet::from([ChildKey {
            kind: ChildKind::StatefulSet,
            name: "bot".into(),
        }]);
        let prune = to_prune(
            [
                (ChildKind::Secret, &a),
                (ChildKind::StatefulSet, &b),
                (ChildKind::Secret, &c),
                (ChildKind::StatefulSet, &d),
            ],
            "u1",
            &desired,
        );
        let names: Vec<String> = prune.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["StatefulSet/bot-redis", "Secret/bot-redis"]);
    }
}
