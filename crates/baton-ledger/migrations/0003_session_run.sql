-- The Redis run (INFO run_id) whose states the ledger follows for a session.
-- A check against the ledger after Redis restarted or failed over claims
-- the row for the run answering now; from then on a shipper that read its
-- records in an earlier run (and was held up until after the check) is
-- refused, so the ledger never vouches for the state the check replaced.
-- NULL: rows written before this column, or by Redis alone; the next
-- shipment or claim sets it.
ALTER TABLE sessions ADD COLUMN run TEXT;
