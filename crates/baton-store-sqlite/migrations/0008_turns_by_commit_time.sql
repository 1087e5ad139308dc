-- The retention (--ledger-retention) deletes turn records by commit time.
CREATE INDEX IF NOT EXISTS turns_committed_at ON turns (committed_at_ms);
