-- Declare the known index complete for this Redis run (see redis/known.rs).
-- KEYS: 1 the index's watermark. ARGV: 1 the run that was read before the
-- backfill began.
-- Only in that run: a restart since may have loaded a dataset in which
-- markers the backfill wrote are missing, and the new run must be indexed
-- on its own. Answers 1 when it wrote the watermark, 0 when not.
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if run ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], run)
return 1
