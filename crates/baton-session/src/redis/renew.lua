-- Extend the lease if it is still ours. KEYS: 1 lease. ARGV: 1 fence, 2 TTL ms.
if redis.call('HGET', KEYS[1], 'fence') == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
