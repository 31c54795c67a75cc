-- KEYS a room's (see room_common.lua); ARGV now (s), most members to remove.
-- Removes the members whose stay ended (crashed connections, the end of the grace).
-- Returns {the users removed, the room's next due time}.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, uid in ipairs(gone) do room_remove(uid) end
return {gone, room_next_due()}
