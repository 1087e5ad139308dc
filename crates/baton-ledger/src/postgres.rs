//! The Postgres turn ledger: every committed turn exactly once (primary key
//! on tenant, session, turnSeq; inserts are idempotent, so shipping at least
//! once is enough), and per session its counters and a durable copy of its
//! state, from which a session the coordination store lost is restored.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use sqlx::ConnectOptions as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use baton_session::durable::{DurableCopy, LedgerSession, ShipBatch};
use baton_session::ids::SessionKey;
use baton_session::model::{ListQuery, SessionPage, TurnRecord};
use baton_session::sql::{col, counter, session_summary, turn_record};
use baton_session::store::{StoreError, StoreResult, page_size};

#[derive(Clone)]
pub struct PostgresLedger {
    pool: PgPool,
}

fn db_error(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(format!("ledger: {e}"))
}

/// The `sessions` rows of one `record_many`, column by column (UNNEST).
#[derive(Default)]
struct SessionColumns<'a> {
    tenant: Vec<&'a str>,
    session: Vec<&'a str>,
    last_version: Vec<i64>,
    last_turn_seq: Vec<i64>,
    last_fence: Vec<i64>,
    last_replica: Vec<&'a str>,
    last_turn_at_ms: Vec<i64>,
    turn_count: Vec<i64>,
    state_version: Vec<Option<i64>>,
    state_payload: Vec<Option<&'a [u8]>>,
    state_workspace: Vec<Option<&'a str>>,
    run: Vec<Option<&'a str>>,
}

/// The Postgres schema of a store namespace: `baton@<namespace>`, cut to
/// Postgres' 63-byte identifiers with a hash of the whole when longer;
/// `None` (the `public` schema) for the empty namespace. Namespaces are
/// checked to be `A-Z a-z 0-9 . _ -` (see the sidecar's settings), so the
/// quoted identifier needs no escaping.
fn schema_of(namespace: &str) -> Option<String> {
    if namespace.is_empty() {
        return None;
    }
    let whole = format!("baton@{}", baton_session::id_encoding::path_part(namespace));
    if whole.len() <= 63 {
        return Some(whole);
    }
    use sha2::Digest as _;
    let hash = format!("{:x}", sha2::Sha256::digest(namespace.as_bytes()));
    Some(format!("{}!{}", &whole[..46], &hash[..16]))
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl PostgresLedger {
    /// Connects and applies the migrations (under Postgres' advisory lock,
    /// so replicas starting together migrate once).
    pub async fn connect(url: &str) -> StoreResult<Self> {
        Self::connect_in(url, "").await
    }

    /// [`Self::connect`] in the store namespace `namespace`: its tables
    /// live in a Postgres schema of their own (created if missing), so
    /// deployments sharing a database never meet. The empty namespace is
    /// the `public` schema, where the ledger lived before namespaces.
    pub async fn connect_in(url: &str, namespace: &str) -> StoreResult<Self> {
        if let Some(schema) = schema_of(namespace) {
            let mut conn = url
                .parse::<PgConnectOptions>()
                .map_err(db_error)?
                .connect()
                .await
                .map_err(db_error)?;
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                .execute(&mut conn)
                .await
                .map_err(db_error)?;
        }
        let pool = Self::connect_reader_in(url, namespace).await?.pool;
        baton_session::sql::expand_only(sqlx::migrate!("./migrations"))
            .run(&pool)
            .await
            .map_err(|e| StoreError::Unavailable(format!("ledger migrations: {e}")))?;
        Ok(Self { pool })
    }

    /// Connects without touching the schema: for readers (a dashboard),
    /// which must not migrate what the replicas use.
    pub async fn connect_reader(url: &str) -> StoreResult<Self> {
        Self::connect_reader_in(url, "").await
    }

    /// [`Self::connect_reader`] in the store namespace `namespace`.
    pub async fn connect_reader_in(url: &str, namespace: &str) -> StoreResult<Self> {
        let mut options = url.parse::<PgConnectOptions>().map_err(db_error)?;
        if let Some(schema) = schema_of(namespace) {
            options = options.options([("search_path", format!("\"{schema}\""))]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(options)
            .await
            .map_err(db_error)?;
        Ok(Self { pool })
    }

    /// Records a batch in one transaction. Rows already there are left as
    /// they are, so shipping the same batch twice changes nothing. False
    /// when the batch was refused (see [`Self::record_many`]).
    pub async fn record(&self, batch: &ShipBatch) -> StoreResult<bool> {
        Ok(self
            .record_many(std::slice::from_ref(batch))
            .await?
            .is_empty())
    }

    /// Records the batches of several sessions (each session at most once)
    /// in one transaction of a few statements, however many turns they hold:
    /// shipping cost per turn falls as the load grows.
    ///
    /// Returns the sessions whose batches it refused, recording nothing of
    /// them: batches read from a state another Redis run vouched for than
    /// the one that claimed the session since (a shipper held up across a
    /// restart or a failover; see [`Self::claim`]). Their records stay in
    /// Redis, not acknowledged: read again once the state is vouched for
    /// by the claiming run, they ship.
    pub async fn record_many(&self, batches: &[ShipBatch]) -> StoreResult<Vec<SessionKey>> {
        let mut batches: Vec<&ShipBatch> =
            batches.iter().filter(|b| !b.records.is_empty()).collect();
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        // Postgres locks rows in the order they arrive, and two replicas'
        // shippers may hold the same sessions: in one global order (session
        // key, then turnSeq) their transactions can wait on each other but
        // never deadlock, whatever order the caller gathered them in.
        batches.sort_by(|a, b| a.key.cmp(&b.key));
        // A claim may insert a session's row between the lock and the
        // upsert below (the row did not exist to be locked): the upsert
        // then refuses it, and the whole round runs again, seeing the row.
        for _ in 0..3 {
            if let Some(refused) = self.record_sorted(&batches).await? {
                return Ok(refused);
            }
        }
        Err(StoreError::Unavailable(
            "ledger: sessions kept being claimed while this round recorded them; will retry".into(),
        ))
    }

    /// One try of [`Self::record_many`] on batches in key order; `None`
    /// when a claim raced it (nothing was recorded).
    async fn record_sorted(&self, batches: &[&ShipBatch]) -> StoreResult<Option<Vec<SessionKey>>> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        // First the sessions' rows, locked in key order: a claim (a check
        // after a restart or failover) waits for this round to land, or
        // this round sees its run.
        let claimed = sqlx::query(
            "SELECT s.tenant, s.session, s.run FROM sessions s
             JOIN UNNEST($1::text[], $2::text[]) AS b(tenant, session)
               ON s.tenant = b.tenant AND s.session = b.session
             ORDER BY s.tenant, s.session FOR UPDATE OF s",
        )
        .bind(
            batches
                .iter()
                .map(|b| b.key.tenant.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            batches
                .iter()
                .map(|b| b.key.session.as_str())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error)?;
        let mut claimed_by: HashMap<(String, String), String> = HashMap::new();
        for row in &claimed {
            if let Some(run) = col::<_, Option<String>>(row, "run")? {
                claimed_by.insert((col(row, "tenant")?, col(row, "session")?), run);
            }
        }
        let (batches, refused): (Vec<&ShipBatch>, Vec<&ShipBatch>) =
            batches.iter().copied().partition(|b| {
                let claim = claimed_by.get(&(b.key.tenant.to_string(), b.key.session.to_string()));
                match (claim, &b.run) {
                    (Some(claim), Some(run)) => claim == run,
                    _ => true,
                }
            });
        let refused: Vec<SessionKey> = refused.into_iter().map(|b| b.key.clone()).collect();
        for key in &refused {
            tracing::info!(session = %key,
                "not recording turn records read from a state an earlier Redis run vouched for: the session was checked against the ledger since");
        }
        if batches.is_empty() {
            tx.commit().await.map_err(db_error)?;
            return Ok(Some(refused));
        }
        // One statement per table whatever the batch size: each column goes
        // in as one array parameter and UNNEST turns them back into rows.
        // (A bind parameter per value cost the sidecar ~20k instructions
        // per shipped turn.)
        let mut rows: Vec<(&SessionKey, &TurnRecord)> = batches
            .iter()
            .flat_map(|b| b.records.iter().map(move |r| (&b.key, r)))
            .collect();
        rows.sort_by(|(ka, a), (kb, b)| (ka, a.turn_seq).cmp(&(kb, b.turn_seq)));
        let texts = |f: for<'r> fn(&'r SessionKey, &'r TurnRecord) -> &'r str| -> Vec<&str> {
            rows.iter().map(|(k, r)| f(k, r)).collect()
        };
        let ints = |f: fn(&TurnRecord) -> u64| -> Vec<i64> {
            rows.iter().map(|(_, r)| int(f(r))).collect()
        };
        let done = sqlx::query(
            "INSERT INTO turns (tenant, session, turn_seq, version, replica, fence, input_digest,
               reply_digest, workspace, started_at_ms, committed_at_ms, input_text, reply_text)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[],
               $6::int8[], $7::text[], $8::text[], $9::text[], $10::int8[], $11::int8[],
               $12::text[], $13::text[])
             ON CONFLICT (tenant, session, turn_seq) DO NOTHING RETURNING tenant, session",
        )
        .bind(texts(|k, _| k.tenant.as_str()))
        .bind(texts(|k, _| k.session.as_str()))
        .bind(ints(|r| r.turn_seq))
        .bind(ints(|r| r.version))
        .bind(texts(|_, r| r.replica.as_str()))
        .bind(ints(|r| r.fence))
        .bind(texts(|_, r| r.input_digest.as_str()))
        .bind(texts(|_, r| r.reply_digest.as_str()))
        .bind(
            rows.iter()
                .map(|(_, r)| r.workspace.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(ints(|r| r.started_at_ms))
        .bind(ints(|r| r.committed_at_ms))
        .bind(
            rows.iter()
                .map(|(_, r)| r.input.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, r)| r.reply.as_deref())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error)?;
        // Rows actually inserted per session, for turn_count.
        let mut inserted: HashMap<(String, String), i64> = HashMap::new();
        for row in done {
            *inserted
                .entry((col(&row, "tenant")?, col(&row, "session")?))
                .or_default() += 1;
        }

        // Per session: its last record, its highest fence, the turns this
        // call inserted, and the durable copy when it is not older.
        let mut sessions = SessionColumns::default();
        for batch in &batches {
            // Not empty: filtered above.
            let last = batch
                .records
                .iter()
                .max_by_key(|r| r.version)
                .expect("a batch with records");
            let durable = batch.durable.as_ref().filter(|d| d.version >= last.version);
            sessions.tenant.push(batch.key.tenant.as_str());
            sessions.session.push(batch.key.session.as_str());
            sessions.last_version.push(int(last.version));
            sessions.last_turn_seq.push(int(last.turn_seq));
            sessions.last_fence.push(int(batch
                .records
                .iter()
                .map(|r| r.fence)
                .max()
                .unwrap_or(0)));
            sessions.last_replica.push(last.replica.as_str());
            sessions.last_turn_at_ms.push(int(last.committed_at_ms));
            sessions.turn_count.push(
                inserted
                    .get(&(batch.key.tenant.to_string(), batch.key.session.to_string()))
                    .copied()
                    .unwrap_or(0),
            );
            sessions.state_version.push(durable.map(|d| int(d.version)));
            sessions
                .state_payload
                .push(durable.map(|d| d.payload.as_ref()));
            sessions
                .state_workspace
                .push(durable.and_then(|d| d.workspace.as_deref()));
            sessions.run.push(batch.run.as_deref());
        }
        let upserted = sqlx::query(
            "INSERT INTO sessions (tenant, session, last_version, last_turn_seq, last_fence, last_replica,
               last_turn_at_ms, turn_count, state_version, state_payload, state_workspace, run)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::text[],
               $7::int8[], $8::int8[], $9::int8[], $10::bytea[], $11::text[], $12::text[])
             ON CONFLICT (tenant, session) DO UPDATE SET
               last_version    = GREATEST(sessions.last_version, EXCLUDED.last_version),
               last_turn_seq   = CASE WHEN EXCLUDED.last_version > sessions.last_version THEN EXCLUDED.last_turn_seq ELSE sessions.last_turn_seq END,
               last_fence      = GREATEST(sessions.last_fence, EXCLUDED.last_fence),
               last_replica    = CASE WHEN EXCLUDED.last_version > sessions.last_version THEN EXCLUDED.last_replica ELSE sessions.last_replica END,
               last_turn_at_ms = GREATEST(sessions.last_turn_at_ms, EXCLUDED.last_turn_at_ms),
               turn_count      = sessions.turn_count + EXCLUDED.turn_count,
               state_version   = CASE WHEN EXCLUDED.state_version > COALESCE(sessions.state_version, -1) THEN EXCLUDED.state_version ELSE sessions.state_version END,
               state_payload   = CASE WHEN EXCLUDED.state_version > COALESCE(sessions.state_version, -1) THEN EXCLUDED.state_payload ELSE sessions.state_payload END,
               state_workspace = CASE WHEN EXCLUDED.state_version > COALESCE(sessions.state_version, -1) THEN EXCLUDED.state_workspace ELSE sessions.state_workspace END,
               run             = COALESCE(sessions.run, EXCLUDED.run)
             WHERE sessions.run IS NULL OR EXCLUDED.run IS NULL OR sessions.run = EXCLUDED.run",
        )
        .bind(sessions.tenant)
        .bind(sessions.session)
        .bind(sessions.last_version)
        .bind(sessions.last_turn_seq)
        .bind(sessions.last_fence)
        .bind(sessions.last_replica)
        .bind(sessions.last_turn_at_ms)
        .bind(sessions.turn_count)
        .bind(sessions.state_version)
        .bind(sessions.state_payload)
        .bind(sessions.state_workspace)
        .bind(sessions.run)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
        if upserted.rows_affected() < batches.len() as u64 {
            // A claim inserted a row after the lock above: start over.
            tx.rollback().await.map_err(db_error)?;
            return Ok(None);
        }
        tx.commit().await.map_err(db_error)?;
        Ok(Some(refused))
    }

    /// What the ledger knows of `key`, durable copy included.
    /// The workspace manifests of every durable copy.
    pub async fn durable_workspaces(&self) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(
            "SELECT state_workspace FROM sessions
             WHERE state_workspace IS NOT NULL AND state_workspace <> ''",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    pub async fn session(&self, key: &SessionKey) -> StoreResult<Option<LedgerSession>> {
        let row = sqlx::query("SELECT * FROM sessions WHERE tenant = $1 AND session = $2")
            .bind(key.tenant.as_str())
            .bind(key.session.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        let Some(row) = row else { return Ok(None) };
        ledger_session(key, &row)
    }

    /// What the ledger knows of `key`, read as the Redis run `run` claims
    /// the session: from now on the ledger records only batches read from
    /// a state `run` vouched for (see [`Self::record_many`]). A shipper
    /// recording this session right now is waited for, so what this
    /// returns includes its turns. Called by the check of a state against
    /// the ledger after Redis restarted or failed over, before it decides.
    ///
    /// A session the ledger does not know gets a row with no turns (so a
    /// batch of an earlier run cannot create it later); such a row reads as
    /// unknown (`None`) here and in [`Self::session`] alike.
    pub async fn claim(&self, key: &SessionKey, run: &str) -> StoreResult<Option<LedgerSession>> {
        let row = sqlx::query(
            "INSERT INTO sessions (tenant, session, last_version, last_turn_seq, last_fence,
               last_replica, last_turn_at_ms, turn_count, run)
             VALUES ($1, $2, 0, 0, 0, '', 0, 0, $3)
             ON CONFLICT (tenant, session) DO UPDATE SET run = EXCLUDED.run
             RETURNING *",
        )
        .bind(key.tenant.as_str())
        .bind(key.session.as_str())
        .bind(run)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        ledger_session(key, &row)
    }

    /// Deletes up to `limit` turn records committed before `before_ms`
    /// (`spec.ledger.retention`); returns how many went.
    pub async fn forget_turns_before(&self, before_ms: u64, limit: u32) -> StoreResult<u64> {
        let mut forgotten = 0;
        for table in ["turns", "interrupted_turns"] {
            let done = sqlx::query(&format!(
                "DELETE FROM {table} WHERE ctid = ANY(ARRAY(
                   SELECT ctid FROM {table} WHERE committed_at_ms < $1 LIMIT $2))"
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

    /// Keeps a turn an interrupt stopped in its session's history.
    pub async fn record_interrupted(&self, turn: &TurnRecord) -> StoreResult<()> {
        sqlx::query(&format!(
            "INSERT INTO interrupted_turns ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
             ON CONFLICT (tenant, session, fence) DO NOTHING",
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

    /// The most recent turns of `key`, newest first.
    pub async fn turns(&self, key: &SessionKey, limit: u32) -> StoreResult<Vec<TurnRecord>> {
        let limit = page_size(limit);
        let rows = sqlx::query(&baton_session::sql::turn_history_query(true))
            .bind(key.tenant.as_str())
            .bind(key.session.as_str())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter().map(turn_record).collect()
    }

    /// Sessions in (tenant, session) order (see [`crate::SessionCatalog`]).
    pub async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionPage> {
        let limit = page_size(query.limit);
        // Only the filters given, so that each shape gets a plan that uses
        // the indexes: `$1 IS NULL OR …` reads every row (30 ms at 100,000
        // sessions).
        // With a prefix, its matches are found through its own index, then
        // sorted: walking the primary key in order and filtering (what the
        // planner picks for ORDER BY … LIMIT) reads the whole tenant when
        // the matches are few (52 ms at 100,000 sessions). `OFFSET 0` keeps
        // the planner from merging the two.
        let fenced = query.prefix.is_some();
        // Rows a claim made that no turn reached yet are no sessions to show.
        let columns = "SELECT tenant, session, last_version, last_turn_seq, last_replica, last_turn_at_ms, turn_count
             FROM sessions WHERE (turn_count > 0 OR state_version IS NOT NULL)";
        let mut sql = sqlx::QueryBuilder::<sqlx::Postgres>::new(if fenced {
            format!("SELECT * FROM ({columns}")
        } else {
            columns.to_owned()
        });
        if let Some(tenant) = &query.tenant {
            sql.push(" AND tenant = ").push_bind(tenant.as_str());
        }
        if let Some(prefix) = &query.prefix {
            sql.push(" AND starts_with(session, ")
                .push_bind(prefix.as_str())
                .push(")");
        }
        if let Some(after) = &query.after {
            sql.push(" AND (tenant, session) > (")
                .push_bind(after.tenant.as_str())
                .push(", ")
                .push_bind(after.session.as_str())
                .push(")");
        }
        if let Some(replica) = &query.replica {
            sql.push(" AND starts_with(last_replica, ")
                .push_bind(replica.as_str())
                .push(")");
        }
        if fenced {
            sql.push(" OFFSET 0) matching");
        }
        sql.push(" ORDER BY tenant, session LIMIT ")
            .push_bind(i64::from(limit) + 1);
        // Unnamed, so planned with its values: a prepared statement's
        // generic plan cannot turn the prefix parameter into an index range.
        let rows = sql
            .build()
            .persistent(false)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        let mut sessions = rows
            .iter()
            .map(session_summary)
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(baton_session::store::page(&mut sessions, limit))
    }

    /// How many turn rows the ledger holds for `key` (tests and the dashboard).
    pub async fn turn_count(&self, key: &SessionKey) -> StoreResult<u64> {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM turns WHERE tenant = $1 AND session = $2")
                .bind(key.tenant.as_str())
                .bind(key.session.as_str())
                .fetch_one(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(uint(n))
    }
}

/// A `sessions` row as a [`LedgerSession`]; `None` for a row a claim
/// created that no turn has reached yet.
fn ledger_session(
    key: &SessionKey,
    row: &sqlx::postgres::PgRow,
) -> StoreResult<Option<LedgerSession>> {
    if counter(row, "turn_count")? == 0 && col::<_, Option<i64>>(row, "state_version")?.is_none() {
        return Ok(None);
    }
    let durable = match col::<_, Option<i64>>(row, "state_version")? {
        Some(version) => Some(DurableCopy {
            version: u64::try_from(version)
                .map_err(|_| StoreError::Corrupt("negative state_version".into()))?,
            payload: Bytes::from(
                col::<_, Option<Vec<u8>>>(row, "state_payload")?.unwrap_or_default(),
            ),
            workspace: col(row, "state_workspace")?,
        }),
        None => None,
    };
    Ok(Some(LedgerSession {
        key: key.clone(),
        last_version: counter(row, "last_version")?,
        last_turn_seq: counter(row, "last_turn_seq")?,
        last_fence: counter(row, "last_fence")?,
        last_replica: col(row, "last_replica")?,
        last_turn_at_ms: counter(row, "last_turn_at_ms")?,
        turn_count: counter(row, "turn_count")?,
        durable,
    }))
}
