-- Work one holder does at a time (the ledger sweeper, the workspace
-- collector): take or keep its lease.
-- KEYS: 1 the lease. ARGV: 1 the shipper's id, 2 TTL ms.
-- Returns 1 when the caller holds it now, 0 when another shipper does.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
