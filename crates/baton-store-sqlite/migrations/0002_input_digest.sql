-- The digest of the input each idempotency record was committed with: a
-- retried turnSeq with another input is TURN_SEQ_REUSED, not the stored
-- reply of the first. Nullable: records written before it compare nothing.
ALTER TABLE turn_results ADD COLUMN input_digest TEXT;
