-- What each replica says of itself with its heartbeat (JSON of
-- baton_views::ReplicaInfo): pod name, start time, draining, turns in
-- flight, build. Nullable: a heartbeat that says nothing leaves it empty.
ALTER TABLE heartbeats ADD COLUMN info TEXT;
