-- Turns an interrupt stopped: kept in the history with their input, never
-- committed (see the ledger's migration of the same name). The columns of
-- `turns`; one row per attempt (its fence).
CREATE TABLE IF NOT EXISTS interrupted_turns (
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
    input_text      TEXT,
    reply_text      TEXT,
    PRIMARY KEY (tenant, session, fence)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS interrupted_turns_committed_at ON interrupted_turns (committed_at_ms);
