-- Want: a reader asks for turn ARGV[1]'s stream (a client rejoining it on
-- another replica, a dashboard watching it). The replica that runs the
-- turn learns it at its next lease check (HMGET 'want') and starts copying
-- the turn's events to the store. Marked only while that turn holds the
-- lease: a later turn's check compares its own turnSeq.
-- KEYS: 1 state. Returns 1 when marked, 0 when that turn does not run.
if redis.call('HGET', KEYS[1], 'lseq') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'want', ARGV[1])
return 1
