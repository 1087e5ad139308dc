-- Turns an interrupt stopped (?onBusy=interrupt, a Stop): kept in the
-- history with their input, never committed. The columns of `turns`, so
-- that the history reads both as one; `version` is the one the turn
-- started from, `committed_at_ms` when it stopped, the reply columns empty.
-- One row per attempt (its fence): a turnSeq may be interrupted more than
-- once before it commits.
CREATE TABLE IF NOT EXISTS interrupted_turns (
    tenant          TEXT   NOT NULL,
    session         TEXT   NOT NULL,
    turn_seq        BIGINT NOT NULL,
    version         BIGINT NOT NULL,
    replica         TEXT   NOT NULL,
    fence           BIGINT NOT NULL,
    input_digest    TEXT   NOT NULL,
    reply_digest    TEXT   NOT NULL,
    workspace       TEXT,
    started_at_ms   BIGINT NOT NULL,
    committed_at_ms BIGINT NOT NULL,
    input_text      TEXT,
    reply_text      TEXT,
    PRIMARY KEY (tenant, session, fence)
);
CREATE INDEX IF NOT EXISTS interrupted_turns_by_turn ON interrupted_turns (tenant, session, turn_seq);
CREATE INDEX IF NOT EXISTS interrupted_turns_committed_at ON interrupted_turns (committed_at_ms);
