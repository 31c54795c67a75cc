-- KEYS the shard's ledger (online, hidden, invisible; see LEDGER); ARGV member, 1 (invisible)
-- or 0. Records the user's choice for the ledger's count, moving them between "online" and
-- "hidden" if they are online (keeping the time they turn offline). Returns 1 when it changed.
local from, to = KEYS[2], KEYS[1]
if ARGV[2] == '1' then
  if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then return 0 end
  from, to = KEYS[1], KEYS[2]
elseif redis.call('SREM', KEYS[3], ARGV[1]) == 0 then
  return 0
end
local at = redis.call('ZSCORE', from, ARGV[1])
if at then
  redis.call('ZREM', from, ARGV[1])
  redis.call('ZADD', to, at, ARGV[1])
end
return 1
