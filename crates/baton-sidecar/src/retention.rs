//! The ledger's retention (`--ledger-retention`, `spec.ledger.retention`):
//! every replica deletes the turn records older than it, in batches, every
//! [`EVERY`]. Replicas racing to delete the same rows is harmless: a row
//! goes once.

use std::time::Duration;

use baton_session::LedgerRetention;
use baton_session::turn_record::now_ms;

/// How often a replica deletes the records past the retention.
pub const EVERY: Duration = Duration::from_secs(600);
/// Rows per delete: one statement never holds the ledger long.
const BATCH: u32 = 5000;

/// Deletes records older than `retention` now, then every [`EVERY`].
pub async fn forget_forever<S: LedgerRetention>(store: S, retention: Duration) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let before = now_ms().saturating_sub(retention.as_millis() as u64);
        let mut forgotten = 0;
        loop {
            match store.forget_turns_before(before, BATCH).await {
                Ok(n) => {
                    forgotten += n;
                    if n < u64::from(BATCH) {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "deleting turn records past the retention failed; tried again later");
                    break;
                }
            }
        }
        if forgotten > 0 {
            tracing::info!(
                forgotten,
                before_ms = before,
                "turn records past the retention deleted"
            );
        }
    }
}
