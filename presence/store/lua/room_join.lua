-- KEYS a room's (see room_common.lua); ARGV user, connection, op ("join" or "beat": a
-- heartbeat renewing a connection's stay, which keeps its place and meta), now (s), expiry (s),
-- joined (ms), meta JSON text, has meta (0/1), invisible (0/1).
-- A member who joins again replaces its connection's meta; a member whose stay ended (not yet
-- swept) joins anew. Returns {1 if the user became a member, 1 if what is shown of the member
-- changed (meta, invisible), the room's next due time}.
local uid, conn, op = ARGV[1], ARGV[2], ARGV[3]
local now, expiry, joined = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local meta = false
if ARGV[8] == '1' then meta = ARGV[7] end
local inv = tonumber(ARGV[9])
local e = room_entry(uid)
local stay_end = redis.call('ZSCORE', KEYS[2], uid)
local new = 0
if not e or not stay_end or tonumber(stay_end) <= now then
  if e then room_remove(uid) end
  e = {i = inv, c = {}}
  new = 1
  redis.call('ZADD', KEYS[1], joined, uid)
end
local before = room_shown(e)
local before_inv = e.i
room_stay(e, now)
local c = e.c[conn]
if c and c[4] == 0 and op == 'beat' then
  c[1] = expiry
else
  e.c[conn] = {expiry, joined, meta, 0}
end
e.i = inv
if inv == 1 then redis.call('SADD', KEYS[4], uid) else redis.call('SREM', KEYS[4], uid) end
redis.call('HSET', KEYS[3], uid, cjson.encode(e))
redis.call('ZADD', KEYS[2], room_stay(e, now), uid)
local changed = 0
if new == 1 or before ~= room_shown(e) or before_inv ~= inv then changed = 1 end
return {new, changed, room_next_due()}
