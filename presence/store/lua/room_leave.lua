-- KEYS a room's (see room_common.lua); ARGV user, connection, now (s), end of the grace (s).
-- The connection leaves the room; if it was its user's last, the user stays until the end of
-- the grace (a reload joins again meanwhile). A connection not in the room: nothing changes.
-- Returns {1 if what is shown of the member changed, the room's next due time}.
local uid, conn = ARGV[1], ARGV[2]
local now, grace_end = tonumber(ARGV[3]), tonumber(ARGV[4])
local e = room_entry(uid)
if not e or not e.c[conn] or e.c[conn][4] == 1 then return {0, room_next_due()} end
local before = room_shown(e)
room_stay(e, now)
local c = e.c[conn]
if not c then return {0, room_next_due()} end
local others = false
for id, other in pairs(e.c) do
  if id ~= conn and other[4] == 0 then others = true end
end
if others then
  e.c[conn] = nil
else
  c[1] = math.min(c[1], grace_end)
  c[4] = 1
end
redis.call('HSET', KEYS[3], uid, cjson.encode(e))
redis.call('ZADD', KEYS[2], room_stay(e, now), uid)
local changed = 0
if before ~= room_shown(e) then changed = 1 end
return {changed, room_next_due()}
