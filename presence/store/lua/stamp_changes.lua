-- KEYS a shard's change stamps (user ids by the time their visible presence last changed) and
-- its epoch (when the stamps began to be kept: absent after a flush or a restart without the
-- data); ARGV[1] now, ARGV[2] the time before which stamps are forgotten, then the members:
-- each user's id (a change of any kind) and its kinds' (changed_since.lua reads them).
-- Each member's stamp moves forward to now; stamps older than ARGV[2] go (a reader accepts no
-- page stamp that old: an absent user then means "no change since the page"). Returns 1.
redis.call('SET', KEYS[2], ARGV[1], 'NX')
local pairs_ = {}
for i = 3, #ARGV do
  pairs_[#pairs_ + 1] = ARGV[1]
  pairs_[#pairs_ + 1] = ARGV[i]
end
-- One ZADD per 1,000 members (unpack's limits).
for start = 1, #pairs_, 2000 do
  redis.call('ZADD', KEYS[1], 'GT', unpack(pairs_, start, math.min(start + 1999, #pairs_)))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
return 1
