-- KEYS a shard's schedules (sorted sets of user ids by due time: due, expiring); ARGV now,
-- limit. Takes the due members of each out and returns them ({due ids, expiring ids}), so two
-- sweepers never handle the same one.
local claimed = {}
for i, key in ipairs(KEYS) do
  local due = redis.call('ZRANGEBYSCORE', key, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
  if #due > 0 then redis.call('ZREM', key, unpack(due)) end
  claimed[i] = due
end
return claimed
