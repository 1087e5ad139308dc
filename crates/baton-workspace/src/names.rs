//! Where things live in the object store, and the one rule for a
//! workspace file's name.

use object_store::path::Path as ObjectPath;

use baton_session::id_encoding::path_part;
use baton_session::ids::SessionKey;

use crate::{WorkspaceError, WorkspaceResult};

/// Where the blob of `hash` lives. A hash that is not 64 lowercase hex
/// digits never came from this code (a hostile or corrupt manifest) and is
/// refused, never used to build a path.
pub(crate) fn blob_path(prefix: &str, hash: &str) -> WorkspaceResult<ObjectPath> {
    let valid = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !valid {
        return Err(WorkspaceError::Corrupt {
            what: hash.chars().take(80).collect(),
            why: "a blob hash must be 64 lowercase hex digits",
        });
    }
    Ok(ObjectPath::from(format!(
        "{prefix}blobs/{}/{hash}",
        &hash[..2]
    )))
}

/// Where the manifest of `version` written under `fence` lives.
pub fn manifest_ref(key: &SessionKey, version: u64, fence: u64) -> String {
    manifest_ref_in("", key, version, fence)
}

pub(crate) fn manifest_ref_in(prefix: &str, key: &SessionKey, version: u64, fence: u64) -> String {
    format!(
        "{prefix}manifests/{}/{}/{version:020}-{fence}.json",
        path_part(key.tenant.as_str()),
        path_part(key.session.as_str())
    )
}

/// Longest file name a workspace holds, in bytes of its `/`-separated
/// path (Linux's `PATH_MAX`), and longest part of it (`NAME_MAX`).
pub const MAX_FILE_NAME_BYTES: usize = 4096;
pub const MAX_FILE_NAME_PART_BYTES: usize = 255;

/// The one rule for a workspace file's name, the `/`-separated path a
/// manifest keys it by: a snapshot stores only names it accepts, and a
/// restore writes only those, so whatever a turn commits the next turn can
/// restore, on any replica. A name is UTF-8 and relative; its parts are
/// not empty, not `.` or `..`, hold no backslash (a separator elsewhere)
/// and no control character (a newline in a name would forge lines in logs
/// and listings), and fit the Linux limits.
pub fn check_file_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("a file name must not be empty");
    }
    if name.len() > MAX_FILE_NAME_BYTES {
        return Err("a file name must be at most 4096 bytes");
    }
    for part in name.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err("a file name must be a plain relative path (no empty, `.` or `..` part)");
        }
        if part.len() > MAX_FILE_NAME_PART_BYTES {
            return Err("each part of a file name must be at most 255 bytes");
        }
        if part.contains('\\') {
            return Err("a file name must not hold a backslash");
        }
        if part.chars().any(char::is_control) {
            return Err("a file name must not hold control characters");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_session::turn_record::digest;

    #[test]
    fn the_file_name_rule_names_what_it_refuses() {
        for good in ["notes.md", "a/b/c.txt", ".env", "a b", "名字.txt", "x..y"] {
            assert_eq!(check_file_name(good), Ok(()), "{good:?}");
        }
        for (bad, says) in [
            ("x\\y", "backslash"),
            ("", "empty"),
            ("a//b", "plain relative"),
            ("/etc/passwd", "plain relative"),
            ("a/../b", "plain relative"),
            ("./a", "plain relative"),
            ("a\nb", "control"),
            ("a\u{7f}", "control"),
            (&"n".repeat(256), "255 bytes"),
            (&"n/".repeat(2100), "4096 bytes"),
        ] {
            let why = check_file_name(bad).unwrap_err();
            assert!(why.contains(says), "{bad:?}: {why}");
        }
    }

    /// Blob names come from manifests, which a hostile writer may forge:
    /// only a SHA-256 in hex becomes a path.
    #[test]
    fn only_a_sha256_names_a_blob() {
        let good = digest(b"x");
        assert!(blob_path("", &good).is_ok());
        for bad in [
            "",
            "a",
            "ab",
            "../../etc/passwd",
            &good.to_uppercase(),
            &format!("{good}0"),
        ] {
            assert!(blob_path("", bad).is_err(), "{bad:?} accepted");
        }
    }
}
