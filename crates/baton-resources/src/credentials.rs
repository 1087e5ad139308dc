//! Credentials of the managed stores.
//!
//! They are an input of the builders, never made inside them: a running
//! Postgres keeps the password it was initialised with, so the operator reads
//! the existing Secret back and only generates what is missing, once.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use rand::distr::{Alphanumeric, SampleString};
use serde::{Deserialize, Serialize};

use baton_api::constants::secret_keys;

/// Length of generated passwords: alphanumeric, so they are URL-safe.
const PASSWORD_LEN: usize = 32;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credentials {
    pub redis_password: String,
    pub postgres_password: String,
    pub object_store_access_key_id: String,
    pub object_store_secret_access_key: String,
    /// The token the operator calls the sidecars' admin API with (drain,
    /// handover during a rollout). Generated when a credentials file has none.
    #[serde(default = "admin_token")]
    pub admin_token: String,
}

fn admin_token() -> String {
    random(PASSWORD_LEN)
}

fn random(len: usize) -> String {
    Alphanumeric.sample_string(&mut rand::rng(), len)
}

impl Credentials {
    /// Fresh random credentials for a deployment that has none yet.
    pub fn generate() -> Self {
        Self {
            redis_password: random(PASSWORD_LEN),
            postgres_password: random(PASSWORD_LEN),
            object_store_access_key_id: format!("baton{}", random(15).to_lowercase()),
            object_store_secret_access_key: random(PASSWORD_LEN),
            admin_token: admin_token(),
        }
    }

    /// Keeps every credential found in the existing Secrets' data and
    /// generates only the missing ones.
    pub fn reuse_or_generate(
        redis: Option<&BTreeMap<String, ByteString>>,
        postgres: Option<&BTreeMap<String, ByteString>>,
        object_store: Option<&BTreeMap<String, ByteString>>,
        admin: Option<&BTreeMap<String, ByteString>>,
    ) -> Self {
        let fresh = Self::generate();
        let read = |data: Option<&BTreeMap<String, ByteString>>, key: &str, fallback: String| {
            data.and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .filter(|v| !v.is_empty())
                .unwrap_or(fallback)
        };
        Self {
            redis_password: read(redis, secret_keys::PASSWORD, fresh.redis_password),
            postgres_password: read(postgres, secret_keys::PASSWORD, fresh.postgres_password),
            object_store_access_key_id: read(
                object_store,
                secret_keys::ACCESS_KEY_ID,
                fresh.object_store_access_key_id,
            ),
            object_store_secret_access_key: read(
                object_store,
                secret_keys::SECRET_ACCESS_KEY,
                fresh.object_store_secret_access_key,
            ),
            admin_token: read(admin, secret_keys::TOKEN, fresh.admin_token),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::secret_data;

    #[test]
    fn generated_credentials_are_distinct_and_url_safe() {
        let a = Credentials::generate();
        let b = Credentials::generate();
        assert_ne!(a, b);
        for value in [
            &a.redis_password,
            &a.postgres_password,
            &a.object_store_secret_access_key,
            &a.admin_token,
        ] {
            assert_eq!(value.len(), PASSWORD_LEN);
            assert!(value.chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn existing_credentials_are_kept_and_only_missing_ones_generated() {
        let postgres = secret_data([(secret_keys::PASSWORD, "in-use-by-the-database".to_owned())]);
        let creds = Credentials::reuse_or_generate(None, Some(&postgres), None, None);
        assert_eq!(creds.postgres_password, "in-use-by-the-database");
        assert_eq!(creds.redis_password.len(), PASSWORD_LEN);
    }
}
