-- Takeover: drop any lease and bump the fence. KEYS: 1 state.
-- Returns the revoked owner (if its lease was unexpired), or false.
-- Numbers are written as decimal integers with string.format('%d'): Redis
-- 7.2.0-7.2.4 turn a Lua number with trailing zeros into "1.7e+15".
local function int(n) return string.format('%d', n) end
local s = redis.call('HMGET', KEYS[1], 'fence', 'owner', 'until')
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner = false
if s[2] and (tonumber(s[3]) or 0) > now_ms then owner = s[2] end
local fence = math.max((tonumber(s[1]) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HDEL', KEYS[1], 'owner', 'until', 'lseq')
redis.call('HSET', KEYS[1], 'fence', int(fence))
return owner
