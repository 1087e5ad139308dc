-- The rules of protocol::decide_commit (src/protocol.rs), in Lua: Redis runs no Rust.
-- Commit a turn in one round trip.
-- KEYS: 1 state, 2 lease (see begin.lua), 3 results, 4 log (list of turn
--       records), 5 payload, 6 staged payload (SET by the caller in the same
--       pipeline, so the bulk data never passes through Lua)
-- ARGV: 1 fence, 2 expected version, 3 new version, 4 workspace ref or "",
--       5 idempotency record ("<version>\n<reply>"), 6 state TTL ms,
--       7 turn record (JSON), 8 turnSeq whose record leaves the retention
--       window or "", 9 commit time (ms), 10 turnSeq, 11 log TTL ms (longer
--       than the state's: unshipped records must outlive a Postgres outage)
-- The caller computes every value it can (new version, records, times), so
-- the script only checks, moves and writes: Lua string work is expensive.
local state, lease, results, log, payload, staged = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

local held = redis.call('GET', lease)
local held_fence, held_seq, owner
if held then held_fence, held_seq, owner = string.match(held, '^(%d+):(%d+):%d+:(.+)$') end
-- The lease must be ours, for this very turn (a caller cannot move turnSeq).
if not owner or held_fence ~= ARGV[1] or held_seq ~= ARGV[10] then
  redis.call('DEL', staged)
  return {'LEASE_LOST'}
end

local stored = redis.call('HGET', state, 'version')
if stored and not tonumber(stored) then
  redis.call('DEL', staged)
  return {'CORRUPT', 'version'}
end
local version = tonumber(stored) or 0
if version ~= tonumber(ARGV[2]) then
  redis.call('DEL', staged)
  return {'CONFLICT', version}
end

local moved = redis.pcall('RENAME', staged, payload)
if type(moved) == 'table' and moved.err then return {'NOT_STAGED'} end

redis.call('HSET', state, 'version', ARGV[3], 'ws', ARGV[4], 'seq', ARGV[10], 'replica', owner, 'updated', ARGV[9])
redis.call('HSET', results, ARGV[10], ARGV[5])
if ARGV[8] ~= '' then redis.call('HDEL', results, ARGV[8]) end
redis.call('RPUSH', log, ARGV[7])
redis.call('DEL', lease)
for _, key in ipairs({state, payload, results}) do redis.call('PEXPIRE', key, ARGV[6]) end
redis.call('PEXPIRE', log, ARGV[11])
return {'COMMITTED', tonumber(ARGV[3])}
