-- no-transaction
-- The retention (spec.ledger.retention) deletes turn records by commit
-- time. Built CONCURRENTLY (hence outside a transaction): a ledger with
-- many turns keeps taking them while the index is built.
CREATE INDEX CONCURRENTLY IF NOT EXISTS turns_committed_at ON turns (committed_at_ms);
