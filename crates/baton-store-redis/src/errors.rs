//! How Redis's failures and odd answers become the store's errors.

use std::time::Duration;

use baton_session::store::StoreError;

pub(crate) fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

pub(crate) fn parse_error(e: redis::ParsingError) -> StoreError {
    corrupt(format!("unexpected reply: {e}"))
}

pub(crate) fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::Corrupt(what.into())
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
