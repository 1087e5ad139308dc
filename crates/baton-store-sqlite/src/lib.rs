//! The embedded backend: one SQLite database (WAL mode) holds state, leases,
//! idempotency records, heartbeats and the turn ledger. It is what `baton dev`
//! uses when no servers are configured, and it is safe for several replica
//! processes on one machine: every write is a `BEGIN IMMEDIATE` transaction,
//! so SQLite's database lock serialises them across processes, and the
//! decisions are the same as the Redis scripts' (the contract suite runs on
//! both).
//!
//! Expiry differs from Redis alone in one way that only makes it safer: when
//! a session's state outlives `stateTtl`, its payload, workspace and
//! idempotency records are dropped but its counters are kept (turnSeq and
//! fence as they were, so the ledger's (tenant, session, turnSeq) stays
//! unique; the version one higher, see [`expire_if_due`]), as Redis with the
//! ledger does.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use baton_session::ids::{ReplicaId, SessionKey};
use baton_session::model::{
    BeginOutcome, BeginRequest, CommitOutcome, CommitRequest, CommittedState, Lease, LeaseCheck,
    LeaseView, ListQuery, ReplicaInfo, ReplicaView, SessionPage, SessionState, SessionView,
    TurnRecord, TurnResult,
};
use baton_session::protocol::{
    BeginDecision, CommitDecision, Counters, LiveLease, decide_begin, decide_commit,
};
use baton_session::sql::{col, counter, session_summary, turn_record};
use baton_session::store::{
    SessionCatalog, StoreError, StoreResult, TurnStore, WorkspaceRoots, page_size,
};
use baton_session::turn_record::{self, now_us};
use sqlx::Row;

pub use baton_session::protocol::RESULTS_RETAINED;

mod streams;

/// A `TurnStore` on a local SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
}

pub(crate) fn db_error(e: sqlx::Error) -> StoreError {
    match e {
        // A column that does not hold what the schema says: corrupt data.
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            StoreError::Corrupt(e.to_string())
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// SQLite integers are signed; the protocol's counters never reach 2^63.
pub(crate) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub async fn open(path: &Path) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(db_error)?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(db_error)?;
        // Two processes opening a new database at once may race; the second
        // attempt sees the first one's tables.
        let migrator = baton_session::sql::expand_only(sqlx::migrate!("./migrations"));
        if migrator.run(&pool).await.is_err() {
            migrator
                .run(&pool)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        }
        Ok(Self { pool })
    }

    pub(crate) async fn immediate(&self) -> StoreResult<sqlx::Transaction<'static, sqlx::Sqlite>> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)
    }
}

/// Drops the state of a session idle past its TTL, keeping its counters.
///
/// The emptied state gets a new version (one higher), never the one it had:
/// a caller that cached that version's payload (`BeginRequest::cached_version`)
/// would otherwise be told to use it, with "you hold this version" and "this
/// version, emptied" looking the same. The reset is not a turn: turnSeq and
/// fence stay, no turn row is written, and versions still only grow. A state
/// already empty (never committed, reset before, or committed empty without
/// a workspace) is left alone: whoever cached it holds the empty state
/// already, and a reset happens once per expiry. Redis with the ledger does
/// the same (`baton-ledger`'s `store.rs`, `recover`).
async fn expire_if_due(
    tx: &mut sqlx::SqliteConnection,
    key: &SessionKey,
    now_ms: i64,
) -> StoreResult<()> {
    let expired = sqlx::query(
        "UPDATE session_state SET version = version + 1, payload = x'', workspace = NULL
         WHERE tenant = ? AND session = ? AND expires_at_ms <= ? AND (length(payload) > 0 OR workspace IS NOT NULL)",
    )
    .bind(key.tenant.as_str())
    .bind(key.session.as_str())
    .bind(now_ms)
    .execute(&mut *tx)
    .await
    .map_err(db_error)?;
    if expired.rows_affected() > 0 {
        sqlx::query("DELETE FROM turn_results WHERE tenant = ? AND session = ?")
            .bind(key.tenant.as_str())
            .bind(key.session.as_str())
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
    }
    Ok(())
}

impl TurnStore for SqliteStore {
    async fn begin(&self, req: &BeginRequest) -> StoreResult<BeginOutcome> {
        let (t, s) = (req.key.tenant.as_str(), req.key.session.as_str());
        let now_us = now_us();
        let now_ms = int(now_us / 1000);
        let mut tx = self.immediate().await?;
        expire_if_due(&mut tx, &req.key, now_ms).await?;

        let state = sqlx::query(
            "SELECT version, payload, workspace, fence, last_seq FROM session_state WHERE tenant = ? AND session = ?",
        )
        .bind(t)
        .bind(s)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let (version, payload, workspace, fence, last) = match &state {
            Some(row) => (
                counter(row, "version")?,
                col::<_, Vec<u8>>(row, "payload")?,
                col::<_, Option<String>>(row, "workspace")?,
                counter(row, "fence")?,
                counter(row, "last_seq")?,
            ),
            None => (0, Vec::new(), None, 0, 0),
        };

        // A lease counts while it is unexpired and its owner still heartbeats.
        let held = sqlx::query(
            "SELECT l.owner, l.expires_at_ms FROM leases l
             JOIN heartbeats h ON h.replica = l.owner AND h.expires_at_ms > ?1
             WHERE l.tenant = ?2 AND l.session = ?3 AND l.expires_at_ms > ?1",
        )
        .bind(now_ms)
        .bind(t)
        .bind(s)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let held = match held {
            // An orphan of the caller's own (see `reclaim_own_lease`).
            Some(row)
                if req.reclaim_own_lease
                    && col::<_, String>(&row, "owner")? == req.replica.as_str() =>
            {
                None
            }
            Some(row) => Some(LiveLease {
                owner: col(&row, "owner")?,
                expires_in: Duration::from_millis(uint(
                    col::<_, i64>(&row, "expires_at_ms")? - now_ms,
                )),
            }),
            None => None,
        };

        let counters = Counters {
            version,
            fence,
            last_turn_seq: last,
        };
        let (seq, fence) = match decide_begin(counters, held, req.turn_seq, now_us) {
            BeginDecision::Grant { turn_seq, fence } => (turn_seq, fence),
            BeginDecision::Busy { owner, retry_after } => {
                return Ok(BeginOutcome::Busy { owner, retry_after });
            }
            BeginDecision::Gap { next_turn_seq } => return Ok(BeginOutcome::Gap { next_turn_seq }),
            BeginDecision::Replay { turn_seq } => {
                let stored = sqlx::query(
                    "SELECT version, reply, input_digest FROM turn_results WHERE tenant = ? AND session = ? AND turn_seq = ?",
                )
                .bind(t)
                .bind(s)
                .bind(int(turn_seq))
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_error)?;
                return Ok(match stored {
                    Some(row)
                        if req.input_digest.as_ref().is_some_and(|asked| {
                            col::<_, Option<String>>(&row, "input_digest")
                                .ok()
                                .flatten()
                                .is_some_and(|stored| stored != *asked)
                        }) =>
                    {
                        BeginOutcome::TurnSeqReused { turn_seq }
                    }
                    Some(row) => BeginOutcome::Duplicate(TurnResult {
                        turn_seq,
                        version: counter(&row, "version")?,
                        reply: Bytes::from(col::<_, Vec<u8>>(&row, "reply")?),
                    }),
                    None => BeginOutcome::Stale {
                        last_turn_seq: last,
                    },
                });
            }
        };
        sqlx::query(
            "INSERT INTO session_state (tenant, session, fence, expires_at_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (tenant, session) DO UPDATE SET fence = ?3",
        )
        .bind(t)
        .bind(s)
        .bind(int(fence))
        .bind(now_ms.saturating_add(ms(req.state_ttl)))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        sqlx::query(
            "INSERT OR REPLACE INTO leases (tenant, session, owner, fence, turn_seq, version, expires_at_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(t)
        .bind(s)
        .bind(req.replica.as_str())
        .bind(int(fence))
        .bind(int(seq))
        .bind(int(version))
        .bind(now_ms.saturating_add(ms(req.lease_ttl)))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;

        let cached = req.cached_version == Some(version);
        Ok(BeginOutcome::Granted {
            lease: Lease {
                key: req.key.clone(),
                replica: req.replica.clone(),
                fence,
                turn_seq: seq,
                version,
            },
            state: SessionState {
                version,
                payload: (!cached).then(|| Bytes::from(payload)),
                workspace,
            },
        })
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> StoreResult<bool> {
        let now_ms = int(now_us() / 1000);
        let renewed = sqlx::query(
            "UPDATE leases SET expires_at_ms = ? WHERE tenant = ? AND session = ? AND fence = ? AND expires_at_ms > ?",
        )
        .bind(now_ms.saturating_add(ms(ttl)))
        .bind(lease.key.tenant.as_str())
        .bind(lease.key.session.as_str())
        .bind(int(lease.fence))
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(renewed.rows_affected() == 1)
    }

    async fn commit(&self, req: &CommitRequest) -> StoreResult<CommitOutcome> {
        baton_session::store::check_commit(req)?;
        let lease = &req.lease;
        let (t, s) = (lease.key.tenant.as_str(), lease.key.session.as_str());
        let now_ms = int(now_us() / 1000);
        let mut tx = self.immediate().await?;

        let held = sqlx::query(
            "SELECT owner, fence, turn_seq FROM leases WHERE tenant = ? AND session = ? AND expires_at_ms > ?",
        )
        .bind(t)
        .bind(s)
        .bind(now_ms)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let version: i64 = sqlx::query_scalar(
            "SELECT version FROM session_state WHERE tenant = ? AND session = ?",
        )
        .bind(t)
        .bind(s)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?
        .unwrap_or(0);
        // The lease must be held for this very turn: a caller cannot move turnSeq.
        let held_fence = match &held {
            Some(row) if counter(row, "turn_seq")? == lease.turn_seq => {
                Some(counter(row, "fence")?)
            }
            _ => None,
        };
        let new_version =
            match decide_commit(held_fence, lease.fence, uint(version), req.expected_version) {
                CommitDecision::Write { new_version } => int(new_version),
                CommitDecision::LeaseLost => return Ok(CommitOutcome::LeaseLost),
                CommitDecision::Conflict { current_version } => {
                    return Ok(CommitOutcome::Conflict { current_version });
                }
            };
        let held = held.expect("the fence matched, so the lease exists");
        let (owner, seq): (String, i64) = (col(&held, "owner")?, col(&held, "turn_seq")?);

        sqlx::query(
            "UPDATE session_state SET version = ?, payload = ?, workspace = ?, last_seq = ?, last_replica = ?,
             updated_at_ms = ?, turns = turns + 1, expires_at_ms = ? WHERE tenant = ? AND session = ?",
        )
        .bind(new_version)
        .bind(req.payload.as_ref())
        .bind(req.workspace.as_deref())
        .bind(seq)
        .bind(&owner)
        .bind(now_ms)
        .bind(now_ms.saturating_add(ms(req.state_ttl)))
        .bind(t)
        .bind(s)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        sqlx::query("INSERT OR REPLACE INTO turn_results (tenant, session, turn_seq, version, reply, input_digest) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(t)
            .bind(s)
            .bind(seq)
            .bind(new_version)
            .bind(req.reply.as_ref())
            .bind(&req.input_digest)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        sqlx::query("DELETE FROM turn_results WHERE tenant = ? AND session = ? AND turn_seq <= ?")
            .bind(t)
            .bind(s)
            .bind(seq - int(RESULTS_RETAINED))
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;

        // The ledger row, in the same transaction: exactly once by construction.
        let record = turn_record::record(req, uint(now_ms));
        sqlx::query(
            "INSERT OR IGNORE INTO turns (tenant, session, turn_seq, version, replica, fence, input_digest,
             reply_digest, workspace, started_at_ms, committed_at_ms, input_text, reply_text)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(t)
        .bind(s)
        .bind(seq)
        .bind(new_version)
        .bind(&owner)
        .bind(int(lease.fence))
        .bind(&record.input_digest)
        .bind(&record.reply_digest)
        .bind(record.workspace.as_deref())
        .bind(int(record.started_at_ms))
        .bind(now_ms)
        .bind(record.input.as_deref())
        .bind(record.reply.as_deref())
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;

        sqlx::query("DELETE FROM leases WHERE tenant = ? AND session = ?")
            .bind(t)
            .bind(s)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(CommitOutcome::Committed {
            version: uint(new_version),
        })
    }

    async fn abort(&self, lease: &Lease) -> StoreResult<bool> {
        let now_ms = int(now_us() / 1000);
        let released = sqlx::query("DELETE FROM leases WHERE tenant = ? AND session = ? AND fence = ? AND expires_at_ms > ?")
            .bind(lease.key.tenant.as_str())
            .bind(lease.key.session.as_str())
            .bind(int(lease.fence))
            .bind(now_ms)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(released.rows_affected() == 1)
    }

    async fn revoke(&self, key: &SessionKey) -> StoreResult<Option<String>> {
        let (t, s) = (key.tenant.as_str(), key.session.as_str());
        let now_us = now_us();
        let mut tx = self.immediate().await?;
        let owner: Option<String> = sqlx::query_scalar(
            "SELECT owner FROM leases WHERE tenant = ? AND session = ? AND expires_at_ms > ?",
        )
        .bind(t)
        .bind(s)
        .bind(int(now_us / 1000))
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        drop_lease(&mut tx, key, now_us, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(owner)
    }

    async fn record_interrupted(&self, turn: &TurnRecord) -> StoreResult<()> {
        sqlx::query(&format!(
            "INSERT OR IGNORE INTO interrupted_turns ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            baton_session::sql::TURN_COLUMNS
        ))
        .bind(&turn.tenant)
        .bind(&turn.session)
        .bind(int(turn.turn_seq))
        .bind(int(turn.version))
        .bind(&turn.replica)
        .bind(int(turn.fence))
        .bind(&turn.input_digest)
        .bind(&turn.reply_digest)
        .bind(turn.workspace.as_deref())
        .bind(int(turn.started_at_ms))
        .bind(int(turn.committed_at_ms))
        .bind(turn.input.as_deref())
        .bind(turn.reply.as_deref())
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    async fn interrupt(
        &self,
        key: &SessionKey,
        turn_seq: Option<u64>,
    ) -> StoreResult<Option<LeaseView>> {
        let (t, s) = (key.tenant.as_str(), key.session.as_str());
        let now_us = now_us();
        let mut tx = self.immediate().await?;
        let lease = sqlx::query(
            "SELECT owner, fence, turn_seq, expires_at_ms FROM leases WHERE tenant = ? AND session = ? AND expires_at_ms > ?",
        )
        .bind(t)
        .bind(s)
        .bind(int(now_us / 1000))
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let Some(lease) = lease.map(|row| LeaseView {
            owner: row.get(0),
            fence: uint(row.get(1)),
            turn_seq: uint(row.get(2)),
            expires_at_ms: uint(row.get(3)),
        }) else {
            return Ok(None);
        };
        if turn_seq.is_some_and(|n| n != lease.turn_seq) {
            return Ok(None);
        }
        drop_lease(&mut tx, key, now_us, Some(lease.fence)).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(Some(lease))
    }

    async fn check_lease(&self, lease: &Lease) -> StoreResult<LeaseCheck> {
        let (t, s) = (lease.key.tenant.as_str(), lease.key.session.as_str());
        let row = sqlx::query(
            "SELECT
               EXISTS (SELECT 1 FROM leases WHERE tenant = ?1 AND session = ?2 AND fence = ?3 AND expires_at_ms > ?4),
               (SELECT interrupted_fence FROM session_state WHERE tenant = ?1 AND session = ?2),
               EXISTS (SELECT 1 FROM leases WHERE tenant = ?1 AND session = ?2 AND fence = ?3 AND wanted_turn_seq = ?5)",
        )
        .bind(t)
        .bind(s)
        .bind(int(lease.fence))
        .bind(int(now_us() / 1000))
        .bind(int(lease.turn_seq))
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        let held: bool = row.get(0);
        let interrupted: Option<i64> = row.get(1);
        let wanted: bool = row.get(2);
        Ok(if held && wanted {
            LeaseCheck::Followed
        } else if held {
            LeaseCheck::Held
        } else if interrupted == Some(int(lease.fence)) {
            LeaseCheck::Interrupted
        } else {
            LeaseCheck::Lost
        })
    }

    async fn heartbeat_with(
        &self,
        replica: &ReplicaId,
        info: ReplicaInfo,
        ttl: Duration,
    ) -> StoreResult<()> {
        let now_ms = int(now_us() / 1000);
        let info = serde_json::to_string(&info).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query(
            "INSERT INTO heartbeats (replica, expires_at_ms, last_seen_ms, info) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (replica) DO UPDATE SET expires_at_ms = ?2, last_seen_ms = ?3, info = ?4",
        )
        .bind(replica.as_str())
        .bind(now_ms.saturating_add(ms(ttl)))
        .bind(now_ms)
        .bind(info)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    async fn read_state(&self, key: &SessionKey) -> StoreResult<Option<CommittedState>> {
        let row = sqlx::query(
            "SELECT version, payload, workspace FROM session_state
             WHERE tenant = ? AND session = ? AND expires_at_ms > ?",
        )
        .bind(key.tenant.as_str())
        .bind(key.session.as_str())
        .bind(int(now_us() / 1000))
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(CommittedState {
            version: counter(&row, "version")?,
            payload: Bytes::from(col::<_, Vec<u8>>(&row, "payload")?),
            workspace: col(&row, "workspace")?,
        }))
    }

    async fn session(&self, key: &SessionKey) -> StoreResult<Option<SessionView>> {
        let (t, s) = (key.tenant.as_str(), key.session.as_str());
        let now_ms = int(now_us() / 1000);
        let Some(row) = sqlx::query(
            "SELECT version, fence, last_seq, last_replica, updated_at_ms, workspace, expires_at_ms
             FROM session_state WHERE tenant = ? AND session = ?",
        )
        .bind(t)
        .bind(s)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?
        else {
            return Ok(None);
        };
        let expired = col::<_, i64>(&row, "expires_at_ms")? <= now_ms;
        let lease = sqlx::query("SELECT owner, fence, turn_seq, expires_at_ms FROM leases WHERE tenant = ? AND session = ? AND expires_at_ms > ?")
            .bind(t)
            .bind(s)
            .bind(now_ms)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        let lease = match lease {
            Some(l) => Some(LeaseView {
                owner: col(&l, "owner")?,
                fence: counter(&l, "fence")?,
                turn_seq: counter(&l, "turn_seq")?,
                expires_at_ms: counter(&l, "expires_at_ms")?,
            }),
            None => None,
        };
        if expired && lease.is_none() {
            return Ok(None);
        }
        Ok(Some(SessionView {
            key: key.clone(),
            version: counter(&row, "version")?,
            fence: counter(&row, "fence")?,
            last_turn_seq: counter(&row, "last_seq")?,
            last_replica: col(&row, "last_replica")?,
            updated_at_ms: counter(&row, "updated_at_ms")?,
            workspace: if expired {
                None
            } else {
                col(&row, "workspace")?
            },
            lease,
        }))
    }
}

impl WorkspaceRoots for SqliteStore {
    async fn collector_lease(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        let now_ms = int(now_us() / 1000);
        // Taken when free, expired or already this holder's; otherwise the
        // upsert changes no row.
        let taken = sqlx::query(
            "INSERT INTO singleton_leases (name, holder, expires_at_ms) VALUES ('collector', ?1, ?2)
             ON CONFLICT (name) DO UPDATE SET holder = ?1, expires_at_ms = ?2
             WHERE singleton_leases.holder = ?1 OR singleton_leases.expires_at_ms <= ?3",
        )
        .bind(holder)
        .bind(now_ms.saturating_add(ms(ttl)))
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(taken.rows_affected() == 1)
    }

    async fn live_workspaces(&self) -> StoreResult<std::collections::HashSet<String>> {
        // Expired states too: until a turn resets one, it is what a
        // session holds.
        let live: Vec<String> = sqlx::query_scalar(
            "SELECT workspace FROM session_state WHERE workspace IS NOT NULL AND workspace <> ''",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(live.into_iter().collect())
    }
}

/// Drops `key`'s lease and bumps its fence past every one handed out (a
/// takeover, an interrupt), keeping `interrupted`, the fence of the lease
/// an interrupt dropped, when there is one.
async fn drop_lease(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    key: &SessionKey,
    now_us: u64,
    interrupted: Option<u64>,
) -> StoreResult<()> {
    let (t, s) = (key.tenant.as_str(), key.session.as_str());
    sqlx::query("DELETE FROM leases WHERE tenant = ? AND session = ?")
        .bind(t)
        .bind(s)
        .execute(&mut **tx)
        .await
        .map_err(db_error)?;
    sqlx::query(
        "UPDATE session_state SET fence = max(fence + 1, ?),
           interrupted_fence = coalesce(?, interrupted_fence)
         WHERE tenant = ? AND session = ?",
    )
    .bind(int(now_us))
    .bind(interrupted.map(int))
    .bind(t)
    .bind(s)
    .execute(&mut **tx)
    .await
    .map_err(db_error)?;
    Ok(())
}

impl baton_session::LedgerRetention for SqliteStore {
    async fn forget_turns_before(&self, before_ms: u64, limit: u32) -> StoreResult<u64> {
        let mut forgotten = 0;
        for (table, key) in [
            ("turns", "tenant, session, turn_seq"),
            ("interrupted_turns", "tenant, session, fence"),
        ] {
            let done = sqlx::query(&format!(
                "DELETE FROM {table} WHERE ({key}) IN
                   (SELECT {key} FROM {table} WHERE committed_at_ms < ? LIMIT ?)"
            ))
            .bind(int(before_ms))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
            forgotten += done.rows_affected();
        }
        Ok(forgotten)
    }
}

impl SessionCatalog for SqliteStore {
    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionPage> {
        let limit = page_size(query.limit);
        let rows = sqlx::query(
            "SELECT tenant, session, version AS last_version, last_seq AS last_turn_seq, last_replica,
               updated_at_ms AS last_turn_at_ms, turns AS turn_count FROM session_state
             WHERE (?1 IS NULL OR tenant = ?1)
               AND (?2 IS NULL OR substr(session, 1, length(?2)) = ?2)
               AND (?3 IS NULL OR (tenant, session) > (?3, ?4))
               AND (?6 IS NULL OR substr(last_replica, 1, length(?6)) = ?6)
             ORDER BY tenant, session LIMIT ?5",
        )
        .bind(query.tenant.as_ref().map(|t| t.as_str()))
        .bind(query.prefix.as_deref())
        .bind(query.after.as_ref().map(|k| k.tenant.as_str()))
        .bind(query.after.as_ref().map(|k| k.session.as_str()))
        .bind(i64::from(limit) + 1)
        .bind(query.replica.as_deref())
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        let mut sessions = rows
            .iter()
            .map(session_summary)
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(baton_session::store::page(&mut sessions, limit))
    }

    async fn turns(&self, key: &SessionKey, limit: u32) -> StoreResult<Vec<TurnRecord>> {
        let rows = sqlx::query(&baton_session::sql::turn_history_query(false))
            .bind(key.tenant.as_str())
            .bind(key.session.as_str())
            .bind(i64::from(page_size(limit)))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(turn_record).collect()
    }

    async fn inspect(&self, key: &SessionKey) -> StoreResult<Option<SessionView>> {
        TurnStore::session(self, key).await
    }

    async fn inspect_state(&self, key: &SessionKey) -> StoreResult<Option<CommittedState>> {
        TurnStore::read_state(self, key).await
    }

    async fn replicas(&self) -> StoreResult<Vec<ReplicaView>> {
        let rows = sqlx::query(
            "SELECT replica, last_seen_ms, info FROM heartbeats WHERE expires_at_ms > ? ORDER BY replica",
        )
        .bind(int(now_us() / 1000))
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        rows.into_iter()
            .map(|row| {
                let id: String = col(&row, "replica")?;
                Ok(ReplicaView {
                    info: baton_session::store::replica_info(
                        &id,
                        col::<_, Option<String>>(&row, "info")?.as_deref(),
                    )?,
                    id,
                    last_seen_ms: counter(&row, "last_seen_ms")?,
                })
            })
            .collect()
    }
}
