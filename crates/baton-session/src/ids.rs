//! Identifiers, checked before any store key is built from them.

use std::fmt;

/// Longest tenant, session or replica id.
pub const MAX_ID_LEN: usize = 128;

/// Why an id was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is invalid: {rule}")]
pub struct InvalidId {
    pub what: &'static str,
    pub value: String,
    pub rule: &'static str,
}

/// Ids are 1-128 characters of `A-Z a-z 0-9 . _ -`: no `:` (key separator),
/// no `{}` (Redis Cluster hash tags), no whitespace or control characters.
fn check(what: &'static str, value: &str) -> Result<(), InvalidId> {
    let fail = |rule| InvalidId {
        what,
        value: value.chars().take(MAX_ID_LEN + 8).collect(),
        rule,
    };
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
    ($name:ident, $what:literal) => {
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidId> {
                let value = value.into();
                check($what, &value)?;
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

id_type!(TenantId, "tenant");
id_type!(SessionId, "session");
id_type!(ReplicaId, "replica");

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
    fn hostile_ids_are_refused() {
        for bad in [
            "",
            "a:b",
            "{tag}",
            "a b",
            "a\nb",
            "..",
            "é",
            &"x".repeat(129),
            "a/b",
            "*",
        ] {
            assert!(SessionId::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["s-1", "User_42.chat", &"x".repeat(128)] {
            assert!(SessionId::new(good).is_ok(), "{good:?} refused");
        }
    }
}
