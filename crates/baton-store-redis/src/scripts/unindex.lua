-- Drop sessions from the index of unshipped logs, each only if its entry
-- still has the score the sweeper read before it found the session's log
-- empty. Every commit re-adds its session (with a new score) before its
-- record reaches the log, in the same pipeline, so an entry whose score
-- did not move had no commit since: its log stays empty.
-- KEYS: 1 the index. ARGV: member and score (as ZRANGE printed it), pairs.
-- Returns how many were dropped.
local dropped = 0
for i = 1, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return dropped
