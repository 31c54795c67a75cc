-- KEYS a room's (see room_common.lua); ARGV user, connection, op ("join" or "beat": a
-- heartbeat renewing a connection's stay, which keeps its place and meta), now (s), expiry (s,
-- base 36), joined (ms, base 36: the entry's own form), meta JSON text, has meta (0/1),
-- invisible (0/1), public (0/1: the user's online status may be shown to everyone; in the
-- room's index of such members), then with KEYS[2] (the rooms' schedule) the room's due time
-- and name (room_common.lua's schedule).
-- A member who joins again replaces its connection's meta; a member whose stay ended (not yet
-- swept) joins anew: it left when its stay ended, and enters now. A 'beat' of a connection
-- that left (a renewal under way when the leave was written) keeps it left, until its grace
-- ends: only a join enters again. Returns {1 if the user became a member, 1 if what is shown of
-- the member changed (meta, invisible) or who may be shown it (public: a viewer who read the
-- room through the index before the flag was written must be told), the outbox entries made
-- (room_common.lua's room_made: the left, the entered)}.
local uid, conn, op = ARGV[1], ARGV[2], ARGV[3]
local now, expiry, joined = tonumber(ARGV[4]), from_b36(ARGV[5]), from_b36(ARGV[6])
local has_meta = ARGV[8] == '1'
local inv, open = tonumber(ARGV[9]), tonumber(ARGV[10])
schedule(ARGV[11], ARGV[12])
local d = digest(conn)
local e = load(uid)
local beat_of_left = false
if e and op == 'beat' then
  for _, c in ipairs(e.c) do
    if c.d == d and c.left then beat_of_left = true end
  end
end
if e and stay(e) <= now then
  room_remove(uid, e)
  room_made(-1, stay(e), uid, now)
  -- its stay ended (swept here, announced): a left connection's renewal enters nothing
  if beat_of_left then return {0, 1, MADE} end
  e = nil
end
local new, old, before, before_inv, before_open = 0, 0, false, inv, 0
if e then
  old, before, before_inv, before_open = stay(e), shown(uid, e), e.i, e.o
else
  e = {j = joined, i = inv, o = 0, c = {}}
  new = 1
end
-- connections whose expiry passed are dropped; this one is renewed in place or joins last
local kept, renewed = {}, false
for _, c in ipairs(e.c) do
  if c.d == d and c.left and op == 'beat' then
    renewed = true -- not renewed: it stays left, until its grace ends as any left connection
    if c.x > now then
      kept[#kept + 1] = c
    elseif c.meta then
      redis.call('HDEL', T_KEY, uid .. '|' .. c.d)
    end
  elseif c.d == d and not c.left and c.x > now and op == 'beat' then
    c.x = expiry
    renewed = true
    kept[#kept + 1] = c
  elseif c.x <= now or c.d == d then
    if c.meta then redis.call('HDEL', T_KEY, uid .. '|' .. c.d) end
  else
    kept[#kept + 1] = c
  end
end
if not renewed then
  kept[#kept + 1] = {d = d, x = expiry, left = false, meta = has_meta}
  if has_meta then redis.call('HSET', T_KEY, uid .. '|' .. d, ARGV[7]) end
end
e.c = kept
e.i, e.o = inv, open
if new == 1 then
  -- a join whose time was taken before a sweep elsewhere pruned the member's last stay (a
  -- busy process) enters no earlier than that stay ended
  local entered = math.max(now, index_state().z)
  room_add(uid, e)
  room_made(1, entered, uid, now)
else
  room_store(uid, e, old, before_inv, before_open)
end
-- what is shown now: this connection's meta when it joined last (as just written: not read
-- back), else read
local after
if renewed then after = shown(uid, e) else after = has_meta and ARGV[7] end
local changed = 0
if new == 1 or before ~= after or before_inv ~= inv or before_open ~= open then changed = 1 end
return {new, changed, MADE}
