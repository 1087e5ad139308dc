-- The rules of protocol::decide_commit (src/protocol.rs), in Lua: Redis runs no Rust.
-- Commit a turn in one round trip.
-- KEYS: 1 state, 2 lease (see begin.lua), 3 results, 4 log (list of turn
--       records), 5 payload, 6 staged payload (SET by the caller in the same
--       pipeline, so the bulk data never passes through Lua)
-- ARGV: 1 fence, 2 expected version, 3 (unused), 4 workspace ref or "",
--       5 reply, 6 state TTL ms, 7 turn record (JSON object without
--       committed_at_ms, which is added here),
--       8 results retained (count)
local state, lease, results, log, payload, staged = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local function int(x) return string.format('%.0f', x) end

local held = redis.call('GET', lease)
local held_fence, held_seq, _, owner
if held then held_fence, held_seq, _, owner = string.match(held, '^(%d+):(%d+):(%d+):(.+)$') end
if not held or held_fence ~= ARGV[1] then
  redis.call('DEL', staged)
  return {'LEASE_LOST'}
end

local stored = redis.call('HMGET', state, 'version', 'turns')
if stored[1] and not tonumber(stored[1]) then
  redis.call('DEL', staged)
  return {'CORRUPT', 'version'}
end
local version = tonumber(stored[1]) or 0
local turns = tonumber(stored[2]) or 0
if version ~= tonumber(ARGV[2]) then
  redis.call('DEL', staged)
  return {'CONFLICT', int(version)}
end
if redis.call('EXISTS', staged) == 0 then return {'NOT_STAGED'} end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new_version = version + 1
local seq = tonumber(held_seq)

redis.call('RENAME', staged, payload)
redis.call('HSET', state, 'version', int(new_version), 'ws', ARGV[4],
  'seq', int(seq), 'replica', owner, 'updated', int(now_ms), 'turns', int(turns + 1))

-- The idempotency record: "version\nreply". Older ones beyond the window go.
redis.call('HSET', results, int(seq), int(new_version) .. '\n' .. ARGV[5])
local window = tonumber(ARGV[8])
if seq > window then redis.call('HDEL', results, int(seq - window)) end

-- The caller wrote the record; only the commit time is Redis's. Appended as
-- text: cjson would round 16-digit fences.
redis.call('RPUSH', log, string.sub(ARGV[7], 1, -2) .. ',"committed_at_ms":' .. int(now_ms) .. '}')

redis.call('DEL', lease)
for _, key in ipairs({state, payload, results, log}) do redis.call('PEXPIRE', key, ARGV[6]) end
return {'COMMITTED', int(new_version)}
