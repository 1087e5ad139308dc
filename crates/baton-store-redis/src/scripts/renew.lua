-- Extend the lease if it is still ours and unexpired; the state and payload
-- then live at least as long as the lease (a long turn cannot outlive its
-- state). KEYS: 1 state, 2 payload. ARGV: 1 fence, 2 lease TTL ms.
-- Numbers are written as decimal integers with string.format('%d'): Redis
-- 7.2.0-7.2.4 turn a Lua number with trailing zeros into "1.7e+15".
local function int(n) return string.format('%d', n) end
local s = redis.call('HMGET', KEYS[1], 'fence', 'owner', 'until', 'exp')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not s[2] or s[1] ~= ARGV[1] or (tonumber(s[3]) or 0) <= now_ms then return 0 end
local till = now_ms + tonumber(ARGV[2])
if (tonumber(s[4]) or 0) < till then
  -- One absolute time for both keys: two relative PEXPIREs can land a
  -- millisecond apart, and the payload must not expire before its state.
  redis.call('HSET', KEYS[1], 'until', int(till), 'exp', int(till))
  redis.call('PEXPIREAT', KEYS[1], int(till))
  redis.call('PEXPIREAT', KEYS[2], int(till))
else
  redis.call('HSET', KEYS[1], 'until', int(till))
end
return 1
