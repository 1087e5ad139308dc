-- What was said in a turn, when the deployment keeps it
-- (spec.ledger.content: full, the default): the input and the reply beside
-- their digests. NULL for digests alone and for rows written before.
ALTER TABLE turns ADD COLUMN IF NOT EXISTS input_text TEXT;
ALTER TABLE turns ADD COLUMN IF NOT EXISTS reply_text TEXT;
