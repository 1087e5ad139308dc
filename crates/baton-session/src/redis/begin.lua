-- The rules of protocol::decide_begin (src/protocol.rs), in Lua: Redis runs no Rust.
-- Begin a turn in one round trip.
-- KEYS: 1 state (hash), 2 lease (string "fence:turnSeq:version:owner"),
--       3 results (hash turnSeq -> result), 4 payload
-- The payload is not read here: it lives in its own key, which the caller
-- GETs in the same pipeline (same round trip). Bulk data through Lua costs
-- more than the rest of the script; while the grant holds, nobody else can
-- commit, so what the GET reads is the granted version's payload.
-- ARGV: 1 replica, 2 turnSeq or "", 3 (unused), 4 lease TTL ms,
--       5 state TTL ms, 6 dead owner or "", 7 dead owner's fence or "",
--       8 "create" to start a session that has no state, "report" to answer
--       MISSING instead (the caller then asks the ledger whether it was lost)
-- A lease whose owner the caller found dead (no heartbeat) is taken over only
-- if it is still that owner's with that fence.
local state, lease, results = KEYS[1], KEYS[2], KEYS[3]

local s = redis.call('HMGET', state, 'version', 'fence', 'seq', 'ws')
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
  return {'STALE', last}
end

local held = redis.call('GET', lease)
if held then
  local held_fence, _, _, owner = string.match(held, '^(%d+):(%d+):(%d+):(.+)$')
  if not (ARGV[6] ~= '' and owner == ARGV[6] and held_fence == ARGV[7]) then
    return {'BUSY', owner or '?', redis.call('PTTL', lease), held_fence or '0'}
  end
end

seq = seq or (last + 1)
if seq > last + 1 then return {'GAP', last + 1} end

-- Fences grow by at least one and never lag the clock (in microseconds), so
-- they stay monotonic even after the state was lost and restored.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
fence = math.max(fence + 1, now_us)

-- Numbers go to redis.call and back as integers, exactly (fences are below
-- 2^53); only the lease string needs formatting.
redis.call('HSET', state, 'fence', fence)
-- A grant refreshes the state's TTL, so it cannot expire under a running turn.
redis.call('PEXPIRE', state, ARGV[5])
redis.call('PEXPIRE', KEYS[4], ARGV[5])
redis.call('SET', lease, string.format('%d', fence) .. ':' .. seq .. ':' .. version .. ':' .. ARGV[1], 'PX', ARGV[4])

return {'GRANTED', fence, seq, version, s[4] or ''}
