-- KEYS[1] a schedule (sorted set of user ids by due time); ARGV now, limit. Takes the due
-- members out and returns them, so two sweepers never handle the same one.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
