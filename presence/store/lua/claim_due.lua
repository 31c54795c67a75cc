-- KEYS a shard's schedules (sorted sets of user ids by due time: due, expiring) and its lease
-- (user ids by the time their claim lapses); ARGV now, limit, lease end. Takes the due members
-- of "due" out, with the members whose lease lapsed (their sweeper died, or is stuck, before
-- it was done with them: their viewers and the signal would otherwise wait for nobody), and
-- leases them all until the lease end; the sweeper gives each back (release.lua) once done.
-- A due member still leased to a live sweeper stays due until that one is done. The due
-- members of "expiring" are taken out. Returns {due ids, expiring ids}: two sweepers never
-- hold the same user at once.
local now, limit = ARGV[1], tonumber(ARGV[2])
local leased = KEYS[3]
local due = redis.call('ZRANGEBYSCORE', leased, '-inf', now, 'LIMIT', 0, limit)
if #due < limit then
  local more = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit - #due)
  for _, member in ipairs(more) do
    local lease = redis.call('ZSCORE', leased, member)
    if not lease or tonumber(lease) <= tonumber(now) then
      redis.call('ZREM', KEYS[1], member)
      if not lease then due[#due + 1] = member end
    end
  end
end
for _, member in ipairs(due) do redis.call('ZADD', leased, ARGV[3], member) end
local expiring = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, member in ipairs(expiring) do redis.call('ZREM', KEYS[2], member) end
return {due, expiring}
