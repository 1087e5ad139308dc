-- Turn streams kept on demand (TurnStreamReader::want_events): the turnSeq
-- whose stream a reader asked for, on the lease that runs it, so that its
-- holder learns it at its next lease check. It goes with the lease.
ALTER TABLE leases ADD COLUMN wanted_turn_seq INTEGER;
