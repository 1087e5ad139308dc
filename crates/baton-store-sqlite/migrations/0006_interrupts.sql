-- Interrupts (TurnStore::interrupt): the fence of the lease an interrupt
-- dropped, so that its holder learns why it lost it. It lives and dies
-- with the session's row.
ALTER TABLE session_state ADD COLUMN interrupted_fence INTEGER;
