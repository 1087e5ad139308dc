-- The turn ledger: every committed turn once, and per session its latest
-- counters and a durable copy of its state, from which a session lost by the
-- coordination store (Redis) is restored.

CREATE TABLE sessions (
    tenant            TEXT   NOT NULL,
    session           TEXT   NOT NULL,
    last_version      BIGINT NOT NULL,
    last_turn_seq     BIGINT NOT NULL,
    last_fence        BIGINT NOT NULL,
    last_replica      TEXT   NOT NULL,
    last_turn_at_ms   BIGINT NOT NULL,
    turn_count        BIGINT NOT NULL DEFAULT 0,
    -- The durable copy: the state at state_version (NULL until shipped).
    state_version     BIGINT,
    state_payload     BYTEA,
    state_workspace   TEXT,
    PRIMARY KEY (tenant, session)
);

CREATE TABLE turns (
    tenant          TEXT   NOT NULL,
    session         TEXT   NOT NULL,
    turn_seq        BIGINT NOT NULL,
    version         BIGINT NOT NULL,
    replica         TEXT   NOT NULL,
    fence           BIGINT NOT NULL,
    outcome         TEXT   NOT NULL DEFAULT 'OK',
    input_digest    TEXT   NOT NULL,
    reply_digest    TEXT   NOT NULL,
    workspace       TEXT,
    started_at_ms   BIGINT NOT NULL,
    committed_at_ms BIGINT NOT NULL,
    duration_ms     BIGINT GENERATED ALWAYS AS (committed_at_ms - started_at_ms) STORED,
    PRIMARY KEY (tenant, session, turn_seq)
);

CREATE INDEX turns_by_commit_time ON turns (committed_at_ms);
