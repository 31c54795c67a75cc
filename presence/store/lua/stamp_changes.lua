-- KEYS a shard's change stamps (user ids by the time their visible presence last changed) and
-- its epoch (when the stamps began to be kept: absent after a flush or a restart without the
-- data); ARGV[1] now, ARGV[2] the time before which stamps are forgotten, then the user ids.
-- Each user's stamp moves forward to now; stamps older than ARGV[2] go (a reader accepts no
-- page stamp that old: an absent user then means "no change since the page"). Returns 1.
redis.call('SET', KEYS[2], ARGV[1], 'NX')
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], 'GT', ARGV[1], ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
return 1
