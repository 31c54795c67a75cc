-- KEYS a room's (see room_common.lua); ARGV user, connection, now (s), end of the grace (s,
-- base 36: the entry's own form), at once (0/1), then with KEYS[2] (the rooms' schedule) the
-- room's due time and name (room_common.lua's schedule). The connection leaves the room; if it
-- was its user's last, the user stays until the end of the grace (a reload joins again
-- meanwhile); ``at once`` (the rule refused the user, or the user was deleted) the user leaves
-- now, its connections that left in their grace with it. A connection not in the room: nothing
-- changes. Returns {1 if what is shown of the member changed, the outbox entries made (the
-- left)}.
local uid = ARGV[1]
local now, grace_end, at_once = tonumber(ARGV[3]), from_b36(ARGV[4]), ARGV[5] == '1'
schedule(ARGV[6], ARGV[7])
local d = digest(ARGV[2])
local e = load(uid)
local mine
if e then
  for _, c in ipairs(e.c) do
    if c.d == d then mine = c end
  end
end
if not mine or mine.left or mine.x <= now then return {0, MADE} end
local old, before = stay(e), shown(uid, e)
local others = false
for _, c in ipairs(e.c) do
  if c ~= mine and not c.left and c.x > now then others = true end
end
if at_once and not others then
  room_remove(uid, e)
  room_made(-1, now, uid, now)
  return {1, MADE}
end
local kept = {}
for _, c in ipairs(e.c) do
  if c.x <= now or (c == mine and others) then
    if c.meta then redis.call('HDEL', T_KEY, uid .. '|' .. c.d) end
  else
    kept[#kept + 1] = c
  end
end
if not others then
  mine.x = math.min(mine.x, grace_end)
  mine.left = true
end
e.c = kept
room_store(uid, e, old, e.i, e.o)
local changed = 0
if before ~= shown(uid, e) then changed = 1 end
return {changed, MADE}
