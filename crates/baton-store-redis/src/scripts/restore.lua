-- Restore a session the coordination store lost, or holds in an older
-- version than the ledger, from the ledger's durable copy, unless someone
-- restored (or started, or committed) it meanwhile.
-- KEYS: 1 state, 2 payload, 3 the session's "known" marker (see
--       redis/known.rs). ARGV: 1 version, 2 payload, 3 workspace ref or "",
--       4 turnSeq, 5 highest fence the ledger saw, 6 last replica,
--       7 updated at ms, 8 state TTL ms, 9 "" when the state is missing, or
--       the older version it is to replace, 10 the run that answered
--       MISSING or UNVERIFIED (a restart since may have changed the state
--       the caller judged)
-- Answers this run's id when it restored, nil when it did not.
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if run ~= ARGV[10] then return nil end
if ARGV[9] == '' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return nil end
else
  local v = redis.call('HMGET', KEYS[1], 'version', 'fence')
  if not v[2] or (v[1] or '0') ~= ARGV[9] then return nil end
  -- The older state goes whole: its lease (fenced out below), its
  -- idempotency records (turns the ledger knows better).
  redis.call('DEL', KEYS[1])
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Above every fence granted before the loss: the ledger's highest, and the
-- clock (fences never lag it, see begin.lua).
local fence = math.max(tonumber(ARGV[5]) + 1, now_us)
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'ws', ARGV[3], 'seq', ARGV[4],
  'fence', string.format('%.0f', fence), 'replica', ARGV[6], 'updated', ARGV[7], 'run', run,
  'exp', string.format('%d', math.floor(now_us / 1000) + tonumber(ARGV[8])))
redis.call('SET', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[8])
redis.call('PEXPIRE', KEYS[2], ARGV[8])
-- The ledger knows this session (it restored it).
redis.call('SET', KEYS[3], '1')
return run
