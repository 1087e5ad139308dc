-- This run of Redis vouches for a session's state: the caller checked it
-- against the ledger and found it current (see begin.lua, UNVERIFIED).
-- KEYS: 1 state. ARGV: 1 the version that was checked.
-- Answers this run's id, or nil when the state changed meanwhile (the
-- caller begins again).
local v = redis.call('HMGET', KEYS[1], 'version', 'fence')
if not v[2] or (v[1] or '0') ~= ARGV[1] then return false end
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
redis.call('HSET', KEYS[1], 'run', run)
return run
