-- Turn streams (baton_session::turn_stream): what an agent streamed in a
-- turn, for a client that rejoins it from another replica process. One row
-- per stream with its expiry, one per event.
CREATE TABLE IF NOT EXISTS turn_streams (
    tenant        TEXT    NOT NULL,
    session       TEXT    NOT NULL,
    turn_seq      INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, session, turn_seq)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS turn_streams_expiry ON turn_streams (expires_at_ms);

CREATE TABLE IF NOT EXISTS turn_stream_events (
    tenant   TEXT    NOT NULL,
    session  TEXT    NOT NULL,
    turn_seq INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    n        INTEGER NOT NULL,
    kind     TEXT    NOT NULL,
    data     TEXT    NOT NULL,
    PRIMARY KEY (tenant, session, turn_seq, attempt, n)
) WITHOUT ROWID;
