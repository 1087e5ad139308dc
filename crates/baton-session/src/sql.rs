//! For the backends built on sqlx (the Postgres ledger, the SQLite store):
//! their migrations and reading columns without panicking: a value that does not decode as the
//! schema says is corrupt data, reported as [`StoreError::Corrupt`], never a
//! panic and never read as a default.

use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::ids::SessionKey;
use crate::model::{SessionSummary, TurnRecord};
use crate::store::{StoreError, StoreResult};

pub fn col<'r, R, T>(row: &'r R, name: &str) -> StoreResult<T>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get(name)
        .map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))
}

/// A counter column: an `i64` that must not be negative.
pub fn counter<R>(row: &R, name: &str) -> StoreResult<u64>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let value: i64 = col(row, name)?;
    u64::try_from(value)
        .map_err(|_| StoreError::Corrupt(format!("column {name}: {value} is negative")))
}

/// The columns [`turn_record`] reads, in `turns` and `interrupted_turns`
/// alike; [`turn_history_query`] reads both as one.
pub const TURN_COLUMNS: &str = "tenant, session, turn_seq, version, replica, fence, input_digest, reply_digest, workspace, started_at_ms, committed_at_ms, input_text, reply_text";

/// A session's history, newest first: its committed turns and the turns an
/// interrupt stopped, a turnSeq's attempts by their fence (which grows with
/// every attempt, whatever the replicas' clocks say), so its interrupted
/// attempts come below the commit that followed them. Parameters: tenant, session, limit (`$n` for
/// Postgres when `numbered`, `?n` for SQLite).
pub fn turn_history_query(numbered: bool) -> String {
    let (t, s, l) = if numbered {
        ("$1", "$2", "$3")
    } else {
        ("?1", "?2", "?3")
    };
    format!(
        "SELECT {TURN_COLUMNS}, false AS interrupted FROM turns WHERE tenant = {t} AND session = {s}
         UNION ALL
         SELECT {TURN_COLUMNS}, true AS interrupted FROM interrupted_turns WHERE tenant = {t} AND session = {s}
         ORDER BY turn_seq DESC, fence DESC LIMIT {l}"
    )
}

/// A history row (the same columns in SQLite and in the Postgres ledger).
pub fn turn_record<R>(row: &R) -> StoreResult<TurnRecord>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(TurnRecord {
        tenant: col(row, "tenant")?,
        session: col(row, "session")?,
        turn_seq: counter(row, "turn_seq")?,
        version: counter(row, "version")?,
        replica: col(row, "replica")?,
        fence: counter(row, "fence")?,
        input_digest: col(row, "input_digest")?,
        reply_digest: col(row, "reply_digest")?,
        workspace: col(row, "workspace")?,
        started_at_ms: counter(row, "started_at_ms")?,
        committed_at_ms: counter(row, "committed_at_ms")?,
        input: col(row, "input_text")?,
        reply: col(row, "reply_text")?,
        interrupted: col(row, "interrupted")?,
    })
}

/// A session-list row: `tenant, session, last_version, last_turn_seq,
/// last_replica, last_turn_at_ms, turn_count` (the SQLite query aliases its
/// columns to these names).
pub fn session_summary<R>(row: &R) -> StoreResult<SessionSummary>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(SessionSummary {
        key: SessionKey::new(
            &col::<_, String>(row, "tenant")?,
            &col::<_, String>(row, "session")?,
        )?,
        version: counter(row, "last_version")?,
        last_turn_seq: counter(row, "last_turn_seq")?,
        last_replica: col(row, "last_replica")?,
        last_turn_at_ms: counter(row, "last_turn_at_ms")?,
        turn_count: counter(row, "turn_count")?,
    })
}

/// How every schema change ships: expand only (new tables, new nullable
/// columns), so a build can start against the schema of a newer one. A
/// rollback runs the older image against the database the newer one
/// migrated, and a rollout runs both at once; the older build ignores the
/// migrations it does not know instead of refusing to start. Taking
/// something away (a column an older build reads) is a release of its own,
/// once no build that reads it runs.
pub fn expand_only(mut migrator: sqlx::migrate::Migrator) -> sqlx::migrate::Migrator {
    migrator.set_ignore_missing(true);
    migrator
}
