//! Identifiers, checked before any store key is built from them.
//!
//! Tenant and session ids are the application's own (`lin@example.com`,
//! `user:42`, `用户-1`): any UTF-8 without control characters, up to
//! [`MAX_ID_BYTES`]. They reach keys, paths and object names only through
//! [`crate::id_encoding`]. Replica ids are pod names and stay plain.

use std::fmt;

/// Longest tenant or session id, in bytes of UTF-8.
pub const MAX_ID_BYTES: usize = 256;
/// Longest replica id.
pub const MAX_ID_LEN: usize = 128;

/// Why an id was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is invalid: {rule}")]
pub struct InvalidId {
    pub what: &'static str,
    pub value: String,
    pub rule: &'static str,
}

fn refusal(what: &'static str, value: &str, rule: &'static str) -> InvalidId {
    InvalidId {
        what,
        // Enough to recognise it, never an unbounded echo.
        value: value.chars().take(64).collect(),
        rule,
    }
}

/// Tenant and session ids: 1-256 bytes of UTF-8, no control characters
/// (which no log line, header or terminal shows faithfully).
fn check_name(what: &'static str, value: &str) -> Result<(), InvalidId> {
    if value.is_empty() {
        return Err(refusal(what, value, "must not be empty"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(refusal(what, value, "must be at most 256 bytes of UTF-8"));
    }
    if value.chars().any(char::is_control) {
        return Err(refusal(what, value, "must not contain control characters"));
    }
    Ok(())
}

/// Replica ids are 1-128 characters of `A-Z a-z 0-9 . _ -`, not `.` or
/// `..`: they are pod names, and appear in keys and paths as they are.
fn check(what: &'static str, value: &str) -> Result<(), InvalidId> {
    let fail = |rule| refusal(what, value, rule);
    if value.is_empty() {
        return Err(fail("must not be empty"));
    }
    if value.len() > MAX_ID_LEN {
        return Err(fail("must be at most 128 characters"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(fail("may only contain letters, digits, '.', '_' and '-'"));
    }
    if value == "." || value == ".." {
        return Err(fail("must not be '.' or '..'"));
    }
    Ok(())
}

macro_rules! id_type {
    ($name:ident, $what:literal, $check:ident) => {
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidId> {
                let value = value.into();
                $check($what, &value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(TenantId, "tenant", check_name);
id_type!(SessionId, "session", check_name);
id_type!(ReplicaId, "replica", check);

/// A session is addressed by tenant and session id, never the id alone:
/// two users may both have a session called `s-1`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionKey {
    pub tenant: TenantId,
    pub session: SessionId,
}

impl SessionKey {
    pub fn new(tenant: &str, session: &str) -> Result<Self, InvalidId> {
        Ok(Self {
            tenant: TenantId::new(tenant)?,
            session: SessionId::new(session)?,
        })
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_as_users_have_them_are_accepted() {
        for good in [
            "s-1",
            "lin@example.com",
            "user:42",
            "用户-1",
            "{tag}",
            "a b",
            "..",
            "a/b",
            &"x".repeat(256),
            &"用".repeat(85),
        ] {
            assert!(SessionId::new(good).is_ok(), "{good:?} refused");
            assert!(TenantId::new(good).is_ok(), "{good:?} refused");
        }
        for bad in [
            "",
            "a\nb",
            "a\u{0}b",
            "tab\there",
            "\u{7f}",
            &"x".repeat(257),
            &"用".repeat(86),
        ] {
            let e = SessionId::new(bad).unwrap_err();
            assert_eq!(e.what, "session");
            assert!(e.value.chars().count() <= 64);
        }
    }

    #[test]
    fn replica_ids_stay_plain() {
        for bad in [
            "",
            "a:b",
            "{tag}",
            "a b",
            "..",
            "é",
            &"x".repeat(129),
            "a/b",
        ] {
            assert!(ReplicaId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ReplicaId::new("replica-0-a1b2c3").is_ok());
    }
}
