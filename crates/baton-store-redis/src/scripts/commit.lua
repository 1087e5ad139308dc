-- The rules of protocol::decide_commit (src/protocol.rs), in Lua: Redis runs no Rust.
-- Commit a turn in one round trip.
-- KEYS: 1 state (hash, see begin.lua), 2 log (list of turn records),
--       3 payload, 4 staged payload (PSETEX by the caller in the same
--       pipeline, so the bulk data never passes through Lua; its TTL
--       outlasts the state's, and RENAME keeps it, so the payload never
--       expires before its state and needs no PEXPIRE here), 5 the
--       session's "known" marker (see redis/known.rs)
-- ARGV: 1 fence, 2 expected version, 3 new version, 4 workspace ref or "",
--       5 idempotency record ("<turnSeq>\n<version>\n<reply>"), 6 state
--       TTL ms, 7 turn record (JSON), 8 the record's ring slot
--       (i<turnSeq mod RESULTS_RETAINED>), 9 commit time (ms), 10 turnSeq,
--       11 log TTL ms (longer than the state's: unshipped records must
--       outlive a Postgres outage; every commit moves it on, so each record
--       lives that long after its own commit), 12 "this-run" (Redis with a
--       ledger) to answer UNVERIFIED instead of committing on a state
--       another run vouched for (see below),
--       13 the record's digest slot (d<turnSeq mod RESULTS_RETAINED>), 14
--       "<turnSeq>:<input digest>" for it
-- Each redis.call costs a few microseconds of Lua glue, more than most
-- commands themselves, so the script makes as few as it can: the lease is
-- released by the HSET (an `until` of 0 is an expired lease to every
-- script), records are overwritten in their ring slot rather than deleted.
-- The caller computes every value it can (new version, records, times), so
-- the script only checks, moves and writes: Lua string work is expensive.
-- Numbers are written as decimal integers with string.format('%d'): Redis
-- 7.2.0-7.2.4 turn a Lua number with trailing zeros into "1.7e+15".
local function int(n) return string.format('%d', n) end
local state, log, payload, staged = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local s = redis.call('HMGET', state, 'version', 'fence', 'owner', 'until', 'lseq', 'run', 'k')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The lease must be ours, unexpired, for this very turn (a caller cannot
-- move turnSeq).
if not s[3] or s[2] ~= ARGV[1] or s[5] ~= ARGV[10] or (tonumber(s[4]) or 0) <= now_ms then
  redis.call('DEL', staged)
  return {'LEASE_LOST'}
end
-- With a ledger, the state must have been vouched for by this run of Redis:
-- after a restart, a failover or a slot moving to another master it may be
-- older than the ledger (begin.lua). A caller whose idea of the run was
-- stale got a grant on it anyway; it is told the version and the run, checks
-- the state against the ledger and commits again.
if ARGV[12] == 'this-run' then
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  if s[6] ~= run then
    redis.call('DEL', staged)
    return {'UNVERIFIED', s[1] or '0', run}
  end
end

local version = tonumber(s[1] or 0)
if not version then
  redis.call('DEL', staged)
  return {'CORRUPT', 'version'}
end
if version ~= tonumber(ARGV[2]) then
  redis.call('DEL', staged)
  return {'CONFLICT', version}
end

local moved = redis.pcall('RENAME', staged, payload)
if type(moved) == 'table' and moved.err then return {'NOT_STAGED'} end

redis.call('HSET', state, 'version', ARGV[3], 'ws', ARGV[4], 'seq', ARGV[10], 'replica', s[3],
  'updated', ARGV[9], ARGV[8], ARGV[5], ARGV[13], ARGV[14], 'exp', int(now_ms + tonumber(ARGV[6])), 'until', '0')
redis.call('PEXPIRE', state, ARGV[6])
redis.call('RPUSH', log, ARGV[7])
redis.call('PEXPIRE', log, ARGV[11])
-- With a ledger: the ledger may know this session from now on. Written with
-- the record, so any Redis that holds the record holds the marker too. The
-- state's `k` field says this state's first commit wrote it already: one
-- SET per state, not per turn (a restore or an expiry starts a new state).
if ARGV[12] == 'this-run' and not s[7] then
  redis.call('SET', KEYS[5], '1')
  redis.call('HSET', state, 'k', '1')
end
return {'COMMITTED', tonumber(ARGV[3])}
