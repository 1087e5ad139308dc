//! Who is calling: a static list of bearer tokens, each bound to one tenant.
//! Off by default (one machine, `baton dev`): then the tenant comes from a
//! header and defaults to `default`.

use std::collections::HashMap;

use axum::http::HeaderMap;
use baton_session::TenantId;

/// Header naming the tenant when authentication is off.
pub const TENANT_HEADER: &str = "x-baton-tenant";
/// Tenant of requests that name none while authentication is off.
pub const DEFAULT_TENANT: &str = "default";

#[derive(Clone, Debug)]
pub enum Auth {
    Off,
    /// Tenant tokens, and the operators' tokens for the admin API (drain,
    /// status, preStop), which tenant tokens cannot use.
    Tokens {
        tenants: HashMap<String, TenantId>,
        admins: Vec<String>,
    },
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing bearer token: send `Authorization: Bearer <token>`")]
    Missing,
    #[error("unknown bearer token")]
    Unknown,
    #[error("this is a tenant's token; the admin API needs an admin token")]
    NotAdmin,
    #[error("header {TENANT_HEADER}: {0}")]
    BadTenant(String),
}

impl Auth {
    /// Parses `token=tenant,token=tenant` and the admin tokens
    /// (`token,token`); every problem names its entry. Authentication is on
    /// when either list is given.
    pub fn parse(spec: Option<&str>, admin_spec: Option<&str>) -> Result<Self, String> {
        let spec = spec.filter(|s| !s.trim().is_empty());
        let admin_spec = admin_spec.filter(|s| !s.trim().is_empty());
        if spec.is_none() && admin_spec.is_none() {
            return Ok(Self::Off);
        }
        let mut admins = Vec::new();
        let listed = |spec: Option<&'_ str>| {
            spec.unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        for (i, token) in listed(admin_spec).into_iter().enumerate() {
            if token.len() < 16 {
                return Err(format!(
                    "BATON_ADMIN_TOKENS entry {i}: tokens must be at least 16 characters"
                ));
            }
            admins.push(token);
        }
        let mut tokens = HashMap::new();
        for (i, entry) in listed(spec).into_iter().enumerate() {
            let (token, tenant) = entry
                .split_once('=')
                .ok_or_else(|| format!("BATON_AUTH_TOKENS entry {i}: expected token=tenant"))?;
            if token.len() < 16 {
                return Err(format!(
                    "BATON_AUTH_TOKENS entry {i}: tokens must be at least 16 characters"
                ));
            }
            let tenant = TenantId::new(tenant)
                .map_err(|e| format!("BATON_AUTH_TOKENS entry {i}: tenant: {e}"))?;
            tokens.insert(token.to_owned(), tenant);
        }
        Ok(Self::Tokens {
            tenants: tokens,
            admins,
        })
    }

    /// Whether every caller may use every API (no token list given).
    pub fn is_off(&self) -> bool {
        matches!(self, Self::Off)
    }

    fn bearer(headers: &HeaderMap) -> Result<&str, AuthError> {
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(AuthError::Missing)
    }

    /// Whether the request may use the admin API.
    pub fn admin(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        match self {
            Self::Off => Ok(()),
            Self::Tokens { admins, tenants } => {
                let token = Self::bearer(headers)?;
                if admins.iter().any(|a| a == token) {
                    Ok(())
                } else if tenants.contains_key(token) {
                    Err(AuthError::NotAdmin)
                } else {
                    Err(AuthError::Unknown)
                }
            }
        }
    }

    /// The tenant a request acts for. With admin tokens only (what the
    /// operator sets up), the turn API is open as with authentication off
    /// and only the admin API takes tokens.
    pub fn tenant(&self, headers: &HeaderMap) -> Result<TenantId, AuthError> {
        match self {
            Self::Tokens { tenants, .. } if !tenants.is_empty() => {
                let token = Self::bearer(headers)?;
                tenants.get(token).cloned().ok_or(AuthError::Unknown)
            }
            Self::Off | Self::Tokens { .. } => {
                let name = headers
                    .get(TENANT_HEADER)
                    .map(|v| {
                        v.to_str()
                            .map_err(|_| AuthError::BadTenant("not ASCII".into()))
                    })
                    .transpose()?
                    .unwrap_or(DEFAULT_TENANT);
                TenantId::new(name).map_err(|e| AuthError::BadTenant(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn off_reads_the_tenant_header_or_defaults() {
        let auth = Auth::parse(None, None).unwrap();
        assert_eq!(auth.tenant(&headers(&[])).unwrap().as_str(), "default");
        let acme = headers(&[(TENANT_HEADER, "acme")]);
        assert_eq!(auth.tenant(&acme).unwrap().as_str(), "acme");
        // Tenants are the application's ids, braces and all.
        let braces = headers(&[(TENANT_HEADER, "a{b}")]);
        assert_eq!(auth.tenant(&braces).unwrap().as_str(), "a{b}");
        let long = "x".repeat(257);
        for hostile in [long.as_str(), "a\tb"] {
            assert!(
                matches!(
                    auth.tenant(&headers(&[(TENANT_HEADER, hostile)])),
                    Err(AuthError::BadTenant(_))
                ),
                "{hostile:?}"
            );
        }
    }

    #[test]
    fn tokens_map_to_their_tenant_and_nothing_else_passes() {
        let auth = Auth::parse(
            Some("0123456789abcdef=acme, fedcba9876543210=globex"),
            Some("admin-0123456789ab"),
        )
        .unwrap();
        let ok = headers(&[("authorization", "Bearer fedcba9876543210")]);
        assert_eq!(auth.tenant(&ok).unwrap().as_str(), "globex");
        assert_eq!(auth.tenant(&headers(&[])), Err(AuthError::Missing));
        let wrong = headers(&[("authorization", "Bearer 0123456789abcdeX")]);
        assert_eq!(auth.tenant(&wrong), Err(AuthError::Unknown));
        // With tokens on, the tenant header cannot pick another tenant.
        let spoof = headers(&[
            ("authorization", "Bearer 0123456789abcdef"),
            (TENANT_HEADER, "globex"),
        ]);
        assert_eq!(auth.tenant(&spoof).unwrap().as_str(), "acme");
        // Tenant tokens are not admin tokens, and the other way round.
        assert_eq!(auth.admin(&ok), Err(AuthError::NotAdmin));
        assert_eq!(auth.admin(&wrong), Err(AuthError::Unknown));
        let admin = headers(&[("authorization", "Bearer admin-0123456789ab")]);
        assert_eq!(auth.admin(&admin), Ok(()));
        assert_eq!(auth.tenant(&admin), Err(AuthError::Unknown));
    }

    #[test]
    fn admin_tokens_alone_guard_the_admin_api_and_leave_the_turn_api_open() {
        let auth = Auth::parse(None, Some("admin-0123456789ab")).unwrap();
        let acme = headers(&[(TENANT_HEADER, "acme")]);
        assert_eq!(auth.tenant(&acme).unwrap().as_str(), "acme");
        assert_eq!(auth.tenant(&headers(&[])).unwrap().as_str(), "default");
        assert_eq!(auth.admin(&acme), Err(AuthError::Missing));
        let wrong = headers(&[("authorization", "Bearer admin-0123456789aX")]);
        assert_eq!(auth.admin(&wrong), Err(AuthError::Unknown));
        let admin = headers(&[("authorization", "Bearer admin-0123456789ab")]);
        assert_eq!(auth.admin(&admin), Ok(()));
    }

    #[test]
    fn bad_token_lists_name_the_entry() {
        assert!(
            Auth::parse(Some("short=acme"), None)
                .unwrap_err()
                .contains("entry 0")
        );
        assert!(
            Auth::parse(Some("0123456789abcdef"), None)
                .unwrap_err()
                .contains("token=tenant")
        );
        assert!(
            Auth::parse(Some("0123456789abcdef=ok,0123456789abcdeg=a\u{1}b"), None)
                .unwrap_err()
                .contains("entry 1: tenant")
        );
        assert!(
            Auth::parse(None, Some("short"))
                .unwrap_err()
                .contains("BATON_ADMIN_TOKENS")
        );
    }
}
