-- The rules of protocol::decide_begin (src/protocol.rs), in Lua: Redis runs no Rust.
-- Begin a turn in one round trip.
-- KEYS: 1 state (hash), 2 lease (hash), 3 results (hash turnSeq -> result)
-- ARGV: 1 replica, 2 turnSeq or "", 3 cached version or "", 4 lease TTL ms,
--       5 state TTL ms, 6 dead owner or "", 7 dead owner's fence or "",
--       8 "create" to start a session that has no state, "report" to answer
--       MISSING instead (the caller then asks the ledger whether it was lost)
-- A lease whose owner the caller found dead (no heartbeat) is taken over only
-- if it is still that owner's with that fence.
local state, lease, results = KEYS[1], KEYS[2], KEYS[3]
local function int(x) return string.format('%.0f', x) end

local s = redis.call('HMGET', state, 'version', 'fence', 'seq', 'payload', 'ws')
-- Counters that are present but not numbers mean corrupt data: refuse, never
-- read them as 0 and overwrite.
for i, field in ipairs({'version', 'fence', 'seq'}) do
  if s[i] and not tonumber(s[i]) then return {'CORRUPT', field} end
end
local version = tonumber(s[1]) or 0
local fence = tonumber(s[2]) or 0
local last = tonumber(s[3]) or 0
-- Every state hash has a fence from its first grant on: none means no state.
if not s[2] and ARGV[8] ~= 'create' then return {'MISSING'} end

local seq = tonumber(ARGV[2])
if seq and seq <= last then
  local stored = redis.call('HGET', results, ARGV[2])
  if stored then return {'DUPLICATE', stored} end
  return {'STALE', int(last)}
end

local held = redis.call('HMGET', lease, 'owner', 'fence')
if held[1] and not (ARGV[6] ~= '' and held[1] == ARGV[6] and held[2] == ARGV[7]) then
  return {'BUSY', held[1], redis.call('PTTL', lease), held[2]}
end

seq = seq or (last + 1)
if seq > last + 1 then return {'GAP', int(last + 1)} end

-- Fences grow by at least one and never lag the clock (in microseconds), so
-- they stay monotonic even after the state was lost and restored.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
fence = math.max(fence + 1, now_us)

redis.call('HSET', state, 'fence', int(fence))
if redis.call('PTTL', state) < 0 then redis.call('PEXPIRE', state, ARGV[5]) end
redis.call('DEL', lease)
redis.call('HSET', lease, 'owner', ARGV[1], 'fence', int(fence), 'seq', int(seq), 'version', int(version))
redis.call('PEXPIRE', lease, ARGV[4])

local payload = s[4] or ''
if ARGV[3] ~= '' and tonumber(ARGV[3]) == version then payload = false end
return {'GRANTED', int(fence), int(seq), int(version), payload, s[5] or ''}
