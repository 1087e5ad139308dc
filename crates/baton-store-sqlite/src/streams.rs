//! Turn streams ([`baton_session::turn_stream`]) in SQLite: the events of a
//! stream in `turn_stream_events`, its expiry in `turn_streams`. An append
//! is one `BEGIN IMMEDIATE` transaction that checks the stream's last
//! event first, the rule Redis applies to stream ids; streams past their
//! expiry are deleted by the appends that come after them.

use baton_session::ids::SessionKey;
use baton_session::store::StoreResult;
use baton_session::turn_record::now_us;
use baton_session::turn_stream::{
    EventId, EventKind, MAX_READ, STREAM_TTL, StreamEvent, TurnStreamReader, TurnStreams,
};
use sqlx::Row;

use crate::{SqliteStore, db_error, int, ms, uint};

/// Expired streams deleted per append, so no append pays for a backlog.
const EXPIRED_PER_APPEND: i64 = 16;

impl TurnStreams for SqliteStore {
    async fn append_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        events: &[StreamEvent],
    ) -> StoreResult<bool> {
        let Some(first) = events.first() else {
            return Ok(true);
        };
        let (t, s, seq) = (key.tenant.as_str(), key.session.as_str(), int(turn_seq));
        let now_ms = int(now_us() / 1000);
        let mut tx = self.immediate().await?;
        let expired =
            "SELECT tenant, session, turn_seq FROM turn_streams WHERE expires_at_ms <= ? LIMIT ?";
        sqlx::query(&format!(
            "DELETE FROM turn_stream_events WHERE (tenant, session, turn_seq) IN ({expired})"
        ))
        .bind(now_ms)
        .bind(EXPIRED_PER_APPEND)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        sqlx::query(&format!(
            "DELETE FROM turn_streams WHERE (tenant, session, turn_seq) IN ({expired})"
        ))
        .bind(now_ms)
        .bind(EXPIRED_PER_APPEND)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;

        let top = sqlx::query(
            "SELECT attempt, n FROM turn_stream_events WHERE tenant = ? AND session = ? AND turn_seq = ? ORDER BY attempt DESC, n DESC LIMIT 1",
        )
        .bind(t)
        .bind(s)
        .bind(seq)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        if let Some(row) = top {
            let top: EventId = (uint(row.get(0)), uint(row.get(1)));
            if first.position() <= top {
                return Ok(false);
            }
        }
        for event in events {
            sqlx::query(
                "INSERT INTO turn_stream_events (tenant, session, turn_seq, attempt, n, kind, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(t)
            .bind(s)
            .bind(seq)
            .bind(int(event.attempt))
            .bind(int(event.n))
            .bind(event.kind.as_str())
            .bind(&event.data)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        }
        sqlx::query(
            "INSERT INTO turn_streams (tenant, session, turn_seq, expires_at_ms) VALUES (?, ?, ?, ?) ON CONFLICT (tenant, session, turn_seq) DO UPDATE SET expires_at_ms = excluded.expires_at_ms",
        )
        .bind(t)
        .bind(s)
        .bind(seq)
        .bind(now_ms.saturating_add(ms(STREAM_TTL)))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(true)
    }
}

impl TurnStreamReader for SqliteStore {
    async fn want_events(&self, key: &SessionKey, turn_seq: u64) -> StoreResult<bool> {
        let marked = sqlx::query(
            "UPDATE leases SET wanted_turn_seq = ?3 WHERE tenant = ?1 AND session = ?2 AND turn_seq = ?3 AND expires_at_ms > ?4",
        )
        .bind(key.tenant.as_str())
        .bind(key.session.as_str())
        .bind(int(turn_seq))
        .bind(int(now_us() / 1000))
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(marked.rows_affected() == 1)
    }

    async fn read_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<StreamEvent>> {
        let (attempt, n) = after.map_or((-1, -1), |(a, n)| (int(a), int(n)));
        let rows = sqlx::query(
            "SELECT e.attempt, e.n, e.kind, e.data FROM turn_stream_events e
             JOIN turn_streams s USING (tenant, session, turn_seq)
             WHERE e.tenant = ? AND e.session = ? AND e.turn_seq = ? AND s.expires_at_ms > ?
               AND (e.attempt > ? OR (e.attempt = ? AND e.n > ?))
             ORDER BY e.attempt, e.n LIMIT ?",
        )
        .bind(key.tenant.as_str())
        .bind(key.session.as_str())
        .bind(int(turn_seq))
        .bind(int(now_us() / 1000))
        .bind(attempt)
        .bind(attempt)
        .bind(n)
        .bind(int(limit.clamp(1, MAX_READ) as u64))
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        rows.into_iter()
            .map(|row| {
                let kind: String = row.get(2);
                Ok(StreamEvent {
                    kind: EventKind::parse(&kind).ok_or_else(|| {
                        baton_session::store::StoreError::Corrupt(format!(
                            "{key} turn {turn_seq}: a stream event of kind {kind:?}"
                        ))
                    })?,
                    attempt: uint(row.get(0)),
                    n: uint(row.get(1)),
                    data: row.get(3),
                })
            })
            .collect()
    }
}
