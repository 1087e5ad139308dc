//! How tenant and session ids (any UTF-8 without control characters, as the
//! application has them: `lin@example.com`, `user:42`, `用户-1`) become
//! parts of Redis keys, file names and object keys.
//!
//! One escape for every store: bytes outside `A-Z a-z 0-9 . _ -` become
//! `!XX` (uppercase hex). `!` is not in that set, so the escape is
//! injective, and an id made only of those characters (every id Baton
//! accepted before ids were widened) is its own encoding: existing keys,
//! directories and manifests keep their names. The alphabet holds no `:`,
//! `{`, `}` (Redis key separator and hash tag), no `/` or NUL (paths), and
//! nothing `object_store` escapes again (`%`, `~`), so an object key reads
//! back exactly as written.
//!
//! - [`key_part`] is the escape alone (reversible by [`decode_key_part`]),
//!   for Redis keys, which have no length limit.
//! - [`path_part`] is the escape for a file or object name: `.` and `..`
//!   are escaped too, and an encoding longer than [`MAX_PATH_PART`] (up to
//!   three bytes per byte of a 256-byte id) is cut and completed with `!!`
//!   and the id's SHA-256, which no plain escape contains.
//!
//! URLs are not made here: a link percent-encodes the id itself.

use std::borrow::Cow;

use sha2::Digest as _;

/// Longest [`path_part`]: a component fits every filesystem's name limit
/// (255 bytes) and an object key of a manifest stays under S3's 1024.
pub const MAX_PATH_PART: usize = 166;

/// Bytes kept as they are.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn escape(id: &str) -> String {
    let mut out = String::with_capacity(id.len() + 8);
    for &b in id.as_bytes() {
        if plain(b) {
            out.push(b as char);
        } else {
            out.push('!');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
    out
}

/// `id` as part of a Redis key: the id itself when it is plain.
pub fn key_part(id: &str) -> Cow<'_, str> {
    if id.bytes().all(plain) {
        Cow::Borrowed(id)
    } else {
        Cow::Owned(escape(id))
    }
}

/// The id a [`key_part`] encodes, `None` for text no id encodes to.
pub fn decode_key_part(part: &str) -> Option<String> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'!' => {
                let hex = part.get(i + 1..i + 3)?;
                if !hex.bytes().all(|h| HEX.contains(&h)) {
                    return None;
                }
                let byte = u8::from_str_radix(hex, 16).ok()?;
                // An escape of a plain byte is not what `escape` writes.
                if plain(byte) {
                    return None;
                }
                out.push(byte);
                i += 3;
            }
            b if plain(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// `id` as one file or object name: never `.` or `..`, never longer than
/// [`MAX_PATH_PART`].
pub fn path_part(id: &str) -> Cow<'_, str> {
    if id == "." || id == ".." {
        return Cow::Owned(id.replace('.', "!2E"));
    }
    let escaped = key_part(id);
    if escaped.len() <= MAX_PATH_PART {
        return escaped;
    }
    // Cut before an escape, never inside one, then the hash of the whole
    // id: `!!` appears in no plain escape, so long and short names differ.
    let keep = MAX_PATH_PART - 2 - 64;
    let mut cut = keep;
    let bytes = escaped.as_bytes();
    while cut > 0 && (bytes[cut - 1] == b'!' || (cut >= 2 && bytes[cut - 2] == b'!')) {
        cut -= 1;
    }
    let hash = sha2::Sha256::digest(id.as_bytes());
    let mut out = String::with_capacity(MAX_PATH_PART);
    out.push_str(&escaped[..cut]);
    out.push_str("!!");
    for b in hash {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_ids_are_their_own_encoding() {
        for id in ["s-1", "User_42.chat", "a", &"x".repeat(128)] {
            assert_eq!(key_part(id), id);
            assert_eq!(path_part(id), id);
        }
    }

    #[test]
    fn ids_as_users_have_them() {
        assert_eq!(key_part("lin@example.com"), "lin!40example.com");
        assert_eq!(key_part("user:42"), "user!3A42");
        assert_eq!(key_part("{tag}"), "!7Btag!7D");
        assert_eq!(key_part("用户-1"), "!E7!94!A8!E6!88!B7-1");
        assert_eq!(path_part(".."), "!2E!2E");
        assert_eq!(path_part("a/../b"), "a!2F..!2Fb");
        assert_eq!(key_part("!21"), "!2121");
        let id = "用".repeat(85);
        let long = path_part(&id);
        assert!(long.len() <= MAX_PATH_PART);
        assert!(long.contains("!!"), "{long}");
    }

    /// An id: anything but control characters, up to 256 bytes.
    fn id() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9._-]{1,20}",
            "[!:{}/.%~ a-z]{1,12}",
            "\\PC{1,40}",
            "\\PC{60,85}",
        ]
        .prop_filter("ids are at most 256 bytes", |s| s.len() <= 256)
    }

    proptest! {
        #[test]
        fn encodings_are_safe_and_reversible(id in id()) {
            let key = key_part(&id);
            prop_assert!(!key.contains([':', '{', '}']), "{key}");
            prop_assert_eq!(decode_key_part(&key), Some(id.clone()));
            let path = path_part(&id);
            prop_assert!(path.len() <= MAX_PATH_PART);
            prop_assert!(path != "." && path != "..");
            prop_assert!(path.bytes().all(|b| plain(b) || b == b'!'), "{path}");
            // object_store would escape nothing in it: it reads back as written.
            let object = object_store::path::Path::from(format!("manifests/{path}"));
            prop_assert_eq!(object.to_string(), format!("manifests/{path}"));
        }

        #[test]
        fn distinct_ids_never_share_a_key_or_a_path(a in id(), b in id()) {
            prop_assume!(a != b);
            prop_assert_ne!(key_part(&a), key_part(&b));
            prop_assert_ne!(path_part(&a), path_part(&b));
        }

        #[test]
        fn text_no_id_encodes_to_is_not_decoded(text in "[!A-Fa-z0-9:]{0,12}") {
            if let Some(id) = decode_key_part(&text) {
                prop_assert_eq!(key_part(&id), text);
            }
        }
    }
}
