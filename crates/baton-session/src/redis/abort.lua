-- Release the lease if it is still ours. KEYS: 1 lease. ARGV: 1 fence.
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(%d+):') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
