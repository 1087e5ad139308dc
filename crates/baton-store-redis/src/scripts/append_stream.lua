-- Appends events to a turn's stream (baton_session::turn_stream).
-- KEYS[1]: the stream. ARGV[1]: its TTL in ms; then, per event, in order:
-- its id "<attempt>-<n>", its kind, its data.
-- Returns 1, or 0 with nothing appended when the stream already holds an
-- event at or past the first one: Redis refuses an id at or below the
-- stream's top, so an attempt a newer one has written after adds nothing.
local first = redis.pcall('XADD', KEYS[1], ARGV[2], 'k', ARGV[3], 'd', ARGV[4])
if type(first) == 'table' and first.err then
    return 0
end
for i = 5, #ARGV, 3 do
    redis.call('XADD', KEYS[1], ARGV[i], 'k', ARGV[i + 1], 'd', ARGV[i + 2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
