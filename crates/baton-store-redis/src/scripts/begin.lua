-- The rules of protocol::decide_begin (src/protocol.rs), in Lua: Redis runs no Rust.
-- Begin a turn in one round trip.
-- KEYS: 1 state (hash: counters, the lease, idempotency records), 2 payload,
--       3 the session's "known" marker (set by every ledgered commit and
--       restore, never expires: see redis/known.rs)
-- The state hash holds everything small about a session, so one HMGET reads
-- it and one HSET writes it: each redis.call costs about a microsecond of
-- Lua glue, more than the command itself.
--   version, fence, seq, ws, replica, updated   the committed state
--   exp                                         when the state expires (ms,
--                                               Redis clock)
--   owner, until, lseq                          the lease, while one is held:
--                                               holder, expiry (ms, Redis
--                                               clock), its turnSeq; its
--                                               fence is `fence`
--   k                                           "1" once a ledgered commit
--                                               of this state set the
--                                               session's known marker
--   run                                         the Redis run (INFO run_id)
--                                               that vouched for this state:
--                                               created, restored or checked
--                                               it against the ledger
--   i<turnSeq mod RESULTS_RETAINED>             "<turnSeq>\n<version>\n<reply>":
--                                               a ring of idempotency records;
--                                               a commit overwrites the slot of
--                                               the turn leaving the window, so
--                                               none is ever deleted
-- The payload is not read here: it lives in its own key, which the caller
-- GETs in the same pipeline (same round trip). Bulk data through Lua costs
-- more than the rest of the script; while the grant holds, nobody else can
-- commit, so what the GET reads is the granted version's payload.
-- ARGV: 1 replica, 2 turnSeq or "", 3 that turnSeq's record slot or "",
--       4 lease TTL ms,
--       5 state TTL ms (at least the lease TTL), 6 dead owner or "",
--       7 dead owner's fence or "", 8 "create" to start a session that has
--       no state, "report" (Redis with a ledger) to answer MISSING instead
--       (the caller then asks the ledger whether it was lost, unless the
--       marker is absent and the known index is complete), "create-unknown"
--       to create it only if it has no marker and Redis is still the run in
--       ARGV 9 (the run whose complete known index vouches for the
--       marker's absence; MISSING otherwise), and, with both, to answer
--       UNVERIFIED for a state this Redis run has not vouched for: after a
--       restart Redis may have come back from disk with an older state than
--       the one it acknowledged (AOF fsyncs once a second), and the caller
--       checks it against the ledger before anyone builds on it),
--       9 the caller's idea of the current run (a hint; see RunView in
--       redis/mod.rs: commit.lua asks Redis itself),
--       10 "reclaim" when the caller runs no other turn of this session under
--       its holder id, so a lease that holder has is an orphan (a grant
--       whose answer was lost, a turn that died before releasing it) and is
--       taken over at once,
--       11 that turnSeq's digest slot ("d<turnSeq mod RESULTS_RETAINED>",
--       "<turnSeq>:<input digest>" of the record in the slot) or "": answered
--       with DUPLICATE so the caller can tell a retry from a reused turnSeq

-- A lease whose owner the caller found dead (no heartbeat) is taken over only
-- if it is still that owner's with that fence.
-- Numbers are written as decimal integers with string.format('%d'): Redis
-- 7.2.0-7.2.4 turn a Lua number with trailing zeros into "1.7e+15".
local function int(n) return string.format('%d', n) end
local state = KEYS[1]

local s = redis.call('HMGET', state, 'version', 'fence', 'seq', 'ws', 'owner', 'until', ARGV[3], 'exp', 'run', ARGV[11])
-- Counters that are present but not numbers mean corrupt data: refuse, never
-- read them as 0 and overwrite.
local version, fence, last = tonumber(s[1] or 0), tonumber(s[2] or 0), tonumber(s[3] or 0)
if not version then return {'CORRUPT', 'version'} end
if not fence then return {'CORRUPT', 'fence'} end
if not last then return {'CORRUPT', 'seq'} end
-- Every state hash has a fence from its first grant on: none means no state.
-- Both answers name the run that gave them (asked of Redis: they are rare):
-- what the caller then writes from the ledger must land in that same run.
local function this_run() return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') end
-- MISSING says whether the session has a marker: without one, and with a
-- complete known index in this run, the ledger cannot know it either.
if not s[2] and ARGV[8] ~= 'create' then
  local run, known = this_run(), redis.call('EXISTS', KEYS[3])
  if not (ARGV[8] == 'create-unknown' and known == 0 and run == ARGV[9]) then
    return {'MISSING', run, known}
  end
end
if s[2] and ARGV[8] ~= 'create' and s[9] ~= ARGV[9] then return {'UNVERIFIED', version, this_run()} end

local seq = tonumber(ARGV[2])
if seq and seq <= last then
  -- The slot may hold a later turn's record: the caller checks the turnSeq
  -- in it and answers STALE when it is not this one.
  if s[7] then return {'DUPLICATE', s[7], last, s[10] or false} end
  return {'STALE', last}
end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner, held_until = s[5], tonumber(s[6] or 0)
if owner and held_until and held_until > now_ms then
  local dead = ARGV[6] ~= '' and owner == ARGV[6] and s[2] == ARGV[7]
  local orphan = ARGV[10] == 'reclaim' and owner == ARGV[1]
  if not (dead or orphan) then
    return {'BUSY', owner, held_until - now_ms, s[2]}
  end
end

seq = seq or (last + 1)
if seq > last + 1 then return {'GAP', last + 1} end

-- Fences grow by at least one and never lag the clock (in microseconds), so
-- they stay monotonic even after the state was lost and restored.
fence = math.max(fence + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))

-- Fences and times are below 2^53: exact as Lua numbers.
local till = now_ms + tonumber(ARGV[4])
-- The state must not expire under a running turn: a grant refreshes its TTL
-- when it would end before the lease (a renewal does the same).
local exp = tonumber(s[8]) or 0
-- A new session is vouched for by the run that creates it. Asked of Redis,
-- not taken from the hint: commit.lua compares it with the real run.
if not s[2] then redis.call('HSET', state, 'run', this_run()) end
if exp < till then
  exp = now_ms + tonumber(ARGV[5])
  redis.call('HSET', state, 'fence', int(fence), 'owner', ARGV[1], 'until', int(till), 'lseq', int(seq), 'exp', int(exp))
  -- One absolute time for both keys (and the `exp` field): two relative
  -- PEXPIREs can land a millisecond apart.
  redis.call('PEXPIREAT', state, int(exp))
  redis.call('PEXPIREAT', KEYS[2], int(exp))
else
  redis.call('HSET', state, 'fence', int(fence), 'owner', ARGV[1], 'until', int(till), 'lseq', int(seq))
end

return {'GRANTED', fence, seq, version, s[4] or ''}
