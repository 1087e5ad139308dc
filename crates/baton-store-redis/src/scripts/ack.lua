-- Drop the turn records the ledger has stored, and only those. The caller
-- names each record it shipped by its turnSeq and fence, in log order; the
-- script pops the head of the log while it is the next of them. A record is
-- never dropped for its turnSeq alone: after Redis came back with an older
-- state, turnSeqs are used again, and an unshipped record may carry one at or
-- below the highest shipped. Its fence tells it apart: every grant takes a new
-- one (see begin.lua), and a grant commits at most one record.
-- Shippers read prefixes of the same log, so when another one already dropped
-- the first records of this list, the head is found further down it and the
-- rest are dropped from there. Anything else at the head stays, to be shipped.
-- KEYS: 1 log. ARGV: turnSeq and fence of each shipped record, in log order
-- (2n arguments). Returns how many were dropped.
local n = math.floor(#ARGV / 2)
if n < 1 then return 0 end
local heads = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #heads == 0 then return 0 end
-- Same field names as model::TurnRecord. Ids are JSON-escaped inside the
-- record, so `"turn_seq":` can only be the field itself.
local function id(record)
  return string.match(record, '"turn_seq":(%d+)'), string.match(record, '"fence":(%d+)')
end
local seq, fence = id(heads[1])
local from
for i = 1, n do
  if ARGV[2 * i - 1] == seq and ARGV[2 * i] == fence then
    from = i
    break
  end
end
if not from then return 0 end
local dropped = 1
while heads[dropped + 1] and from + dropped <= n do
  seq, fence = id(heads[dropped + 1])
  local i = from + dropped
  if ARGV[2 * i - 1] ~= seq or ARGV[2 * i] ~= fence then break end
  dropped = dropped + 1
end
redis.call('LTRIM', KEYS[1], dropped, -1)
return dropped
