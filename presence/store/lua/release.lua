-- KEYS[1] a shard's lease (see claim_due); ARGV lease end, members. Gives back the members
-- this sweeper still holds (leased until that very end: one whose lease lapsed and was taken by
-- another sweeper is left to it). Returns how many were given back.
local released = 0
for i = 2, #ARGV do
  local lease = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if lease and tonumber(lease) == tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    released = released + 1
  end
end
return released
