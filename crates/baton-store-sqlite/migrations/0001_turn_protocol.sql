-- The embedded backend: state, leases, idempotency records, heartbeats and
-- the turn ledger in one SQLite database (WAL mode), safe for several replica
-- processes on one machine: every write runs in a BEGIN IMMEDIATE transaction.
-- IF NOT EXISTS: two processes may race to migrate a new database.

CREATE TABLE IF NOT EXISTS session_state (
    tenant        TEXT    NOT NULL,
    session       TEXT    NOT NULL,
    version       INTEGER NOT NULL DEFAULT 0,
    payload       BLOB    NOT NULL DEFAULT x'',
    workspace     TEXT,
    fence         INTEGER NOT NULL DEFAULT 0,
    last_seq      INTEGER NOT NULL DEFAULT 0,
    last_replica  TEXT,
    updated_at_ms INTEGER NOT NULL DEFAULT 0,
    turns         INTEGER NOT NULL DEFAULT 0,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, session)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS leases (
    tenant        TEXT    NOT NULL,
    session       TEXT    NOT NULL,
    owner         TEXT    NOT NULL,
    fence         INTEGER NOT NULL,
    turn_seq      INTEGER NOT NULL,
    version       INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, session)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS turn_results (
    tenant   TEXT    NOT NULL,
    session  TEXT    NOT NULL,
    turn_seq INTEGER NOT NULL,
    version  INTEGER NOT NULL,
    reply    BLOB    NOT NULL,
    PRIMARY KEY (tenant, session, turn_seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS heartbeats (
    replica       TEXT    NOT NULL PRIMARY KEY,
    expires_at_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS turns (
    tenant          TEXT    NOT NULL,
    session         TEXT    NOT NULL,
    turn_seq        INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    replica         TEXT    NOT NULL,
    fence           INTEGER NOT NULL,
    input_digest    TEXT    NOT NULL,
    reply_digest    TEXT    NOT NULL,
    workspace       TEXT,
    started_at_ms   INTEGER NOT NULL,
    committed_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, session, turn_seq)
) WITHOUT ROWID;
