-- KEYS[1] the shard's outbox (see LEDGER); ARGV[1] the newest score to claim, ARGV[2] at most
-- how many. Claims the transitions left unclaimed since then (their caller never got the reply
-- or died before claiming): removes and returns them, so exactly one claimer sends each.
local entries = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, entry in ipairs(entries) do
  redis.call('ZREM', KEYS[1], entry)
end
return entries
