-- What was said in a turn, when the ledger keeps it (--ledger-content
-- full, the default): the input and the reply beside their digests. NULL
-- for digests alone and for rows written before.
ALTER TABLE turns ADD COLUMN input_text TEXT;
ALTER TABLE turns ADD COLUMN reply_text TEXT;
