-- Takeover: drop any lease and bump the fence. KEYS: 1 state, 2 lease.
-- Returns the revoked owner, or false.
local held = redis.call('GET', KEYS[2])
local owner = held and string.match(held, '^%d+:%d+:%d+:(.+)$') or false
redis.call('DEL', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0
  redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', math.max(fence + 1, now_us)))
end
return owner
