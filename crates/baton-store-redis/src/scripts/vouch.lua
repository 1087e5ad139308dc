-- This run of Redis vouches for a session's state: the caller checked it
-- against the ledger and found it current (see begin.lua, UNVERIFIED).
-- KEYS: 1 state. ARGV: 1 the version that was checked, 2 the run that
-- answered UNVERIFIED (if Redis restarted since, the state may be older
-- again than what the caller checked).
-- Answers this run's id, or nil when the state or the run changed meanwhile
-- (the caller begins again).
local v = redis.call('HMGET', KEYS[1], 'version', 'fence')
if not v[2] or (v[1] or '0') ~= ARGV[1] then return nil end
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if run ~= ARGV[2] then return nil end
redis.call('HSET', KEYS[1], 'run', run)
return run
