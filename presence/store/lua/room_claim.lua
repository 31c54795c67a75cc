-- KEYS a shard's room schedule (rooms by due time); ARGV now, limit. Takes the due rooms out
-- and returns them, so two sweepers never sweep the same room at once.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
