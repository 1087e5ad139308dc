-- The rules of protocol::decide_commit (src/protocol.rs), in Lua: Redis runs no Rust.
-- Commit a turn in one round trip.
-- KEYS: 1 state, 2 lease, 3 results, 4 log (list of turn records)
-- ARGV: 1 fence, 2 expected version, 3 payload, 4 workspace ref or "",
--       5 reply, 6 state TTL ms, 7 turn record (JSON object without
--       committed_at_ms, which is added here),
--       8 results retained (count)
local state, lease, results, log = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function int(x) return string.format('%.0f', x) end

local held = redis.call('HMGET', lease, 'fence', 'seq', 'owner')
if held[1] ~= ARGV[1] then return {'LEASE_LOST'} end

local stored = redis.call('HGET', state, 'version')
if stored and not tonumber(stored) then return {'CORRUPT', 'version'} end
local version = tonumber(stored) or 0
if version ~= tonumber(ARGV[2]) then return {'CONFLICT', int(version)} end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new_version = version + 1
local seq = tonumber(held[2])

redis.call('HSET', state, 'version', int(new_version), 'payload', ARGV[3], 'ws', ARGV[4],
  'seq', int(seq), 'replica', held[3], 'updated', int(now_ms))
redis.call('HINCRBY', state, 'turns', 1)

-- The idempotency record: "version\nreply". Older ones beyond the window go.
redis.call('HSET', results, int(seq), int(new_version) .. '\n' .. ARGV[5])
local window = tonumber(ARGV[8])
if seq > window then redis.call('HDEL', results, int(seq - window)) end

-- The caller wrote the record; only the commit time is Redis's. Appended as
-- text: cjson would round 16-digit fences.
redis.call('RPUSH', log, string.sub(ARGV[7], 1, -2) .. ',"committed_at_ms":' .. int(now_ms) .. '}')

redis.call('DEL', lease)
for _, key in ipairs({state, results, log}) do redis.call('PEXPIRE', key, ARGV[6]) end
return {'COMMITTED', int(new_version)}
