-- The dashboard's "session id starts with" filter: `starts_with(session, $1)`
-- can use an index only with the pattern operator class (the primary key's
-- default collation orders text in ways a prefix range cannot rely on).
-- Without it a prefix filter read every session of the tenant (51 ms at
-- 100,000 sessions; web/benches/pages.rs).
CREATE INDEX sessions_by_session_prefix ON sessions (tenant, session text_pattern_ops);
