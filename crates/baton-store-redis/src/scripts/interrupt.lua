-- Interrupt: drop the running turn's lease (of turn ARGV[1] only, unless
-- ARGV[1] is empty), bump the fence as a takeover does, and keep the
-- interrupted fence in 'irq' so its holder learns why its lease went.
-- KEYS: 1 state. Returns {owner, fence, lseq, until} of the lease
-- interrupted, or false when no unexpired lease (of that turn) was held.
-- Numbers are written as decimal integers with string.format('%d'): Redis
-- 7.2.0-7.2.4 turn a Lua number with trailing zeros into "1.7e+15".
local function int(n) return string.format('%d', n) end
local s = redis.call('HMGET', KEYS[1], 'fence', 'owner', 'until', 'lseq')
if not s[2] then return false end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if (tonumber(s[3]) or 0) <= now_ms then return false end
if ARGV[1] ~= '' and s[4] ~= ARGV[1] then return false end
local fence = math.max((tonumber(s[1]) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HDEL', KEYS[1], 'owner', 'until', 'lseq')
redis.call('HSET', KEYS[1], 'fence', int(fence), 'irq', s[1])
return {s[2], s[1], s[4] or '0', s[3]}
