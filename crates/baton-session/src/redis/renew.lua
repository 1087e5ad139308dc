-- Extend the lease if it is still ours. KEYS: 1 lease. ARGV: 1 fence, 2 TTL ms.
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(%d+):') == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
