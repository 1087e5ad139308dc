-- Work one replica does for all (the scheduled workspace collector): a
-- named lease, taken by its holder while it is free or expired.
CREATE TABLE IF NOT EXISTS singleton_leases (
    name          TEXT    NOT NULL PRIMARY KEY,
    holder        TEXT    NOT NULL,
    expires_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
