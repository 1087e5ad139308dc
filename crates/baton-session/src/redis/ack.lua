-- Drop turn records the ledger has stored: pop from the head of the log
-- while the head's turnSeq is at most the highest one shipped. Records are
-- appended in turnSeq order, so a concurrent shipper or commit cannot make
-- this drop a record that was not shipped.
-- KEYS: 1 log. ARGV: 1 highest shipped turnSeq. Returns how many were dropped.
local dropped = 0
while true do
  local head = redis.call('LINDEX', KEYS[1], 0)
  if not head then break end
  local seq = tonumber(string.match(head, '"turn_seq":(%d+)'))
  if not seq or seq > tonumber(ARGV[1]) then break end
  redis.call('LPOP', KEYS[1])
  dropped = dropped + 1
end
return dropped
