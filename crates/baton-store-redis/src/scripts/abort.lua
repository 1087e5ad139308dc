-- Release the lease if it is still ours and unexpired. KEYS: 1 state.
-- ARGV: 1 fence.
local s = redis.call('HMGET', KEYS[1], 'fence', 'owner', 'until')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not s[2] or s[1] ~= ARGV[1] or (tonumber(s[3]) or 0) <= now_ms then return 0 end
redis.call('HDEL', KEYS[1], 'owner', 'until', 'lseq')
return 1
