//! Manifests are stored data anyone with write access to the bucket can
//! forge. Whatever a manifest says (names that climb out, odd characters,
//! hashes of any length, sizes that lie), materialising it and reading its
//! files answers with a result or a typed error: never a panic, and never a
//! byte written outside the workspace directory.

use std::collections::BTreeMap;
use std::path::Path;

use baton_session::SessionKey;
use baton_session::turn_record::digest;
use baton_workspace::{FileEntry, Manifest, WorkspaceStore};
use proptest::prelude::*;

/// Names a hostile manifest may hold, plain ones among them.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,8}(/[a-z]{1,8}){0,2}",
        "(\\.\\./|\\./|/|\\\\|[a-z]{1,3}){1,6}",
        "\\PC{0,16}",
        any::<String>(),
    ]
}

/// Hashes: real ones (of content the store holds), well-formed ones of
/// nothing, and anything else.
fn blob(real: String) -> impl Strategy<Value = String> {
    prop_oneof![Just(real), "[0-9a-f]{64}", "[0-9a-f]{0,3}", any::<String>(),]
}

fn manifest(real: String) -> impl Strategy<Value = BTreeMap<String, (String, u64)>> {
    proptest::collection::btree_map(name(), (blob(real), any::<u64>()), 0..6)
}

/// Every path under `dir`, relative.
fn everything_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            found.push(
                entry
                    .path()
                    .strip_prefix(dir)
                    .unwrap()
                    .display()
                    .to_string(),
            );
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn a_forged_manifest_never_panics_or_escapes(
        files in manifest(digest(b"real content")),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let root = tempfile::tempdir().unwrap();
            let store = WorkspaceStore::local(&root.path().join("objects")).unwrap();
            // A real blob, so some entries point at content that exists.
            let source = root.path().join("source");
            std::fs::create_dir_all(&source).unwrap();
            std::fs::write(source.join("real.txt"), "real content").unwrap();
            let key = SessionKey::new("acme", "forged").unwrap();
            store
                .snapshot(&source, &Manifest::default(), &key, 1, 1)
                .await
                .unwrap();
            let forged = Manifest {
                files: files
                    .iter()
                    .map(|(name, (blob, size))| {
                        (name.clone(), FileEntry { blob: blob.clone(), size: *size })
                    })
                    .collect(),
            };
            let reference = store.put_manifest_for_test(&key, &forged).await.unwrap();
            let outside_before = everything_under(root.path());
            let ws = root.path().join("ws");
            // Ok or a typed error: a panic fails the property.
            let _ = store.materialize(Some(&reference), &ws).await;
            for name in files.keys() {
                let _ = store.read_file(&reference, name).await;
            }
            let written: Vec<String> = everything_under(root.path())
                .into_iter()
                .filter(|p| !outside_before.contains(p) && !p.starts_with("ws"))
                .collect();
            prop_assert!(written.is_empty(), "written outside the workspace: {written:?}");
            Ok(())
        })?;
    }
}
