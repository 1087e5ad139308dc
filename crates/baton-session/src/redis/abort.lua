-- Release the lease if it is still ours. KEYS: 1 lease. ARGV: 1 fence.
if redis.call('HGET', KEYS[1], 'fence') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
