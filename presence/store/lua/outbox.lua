-- An outbox (lua/outbox.lua, before ledger.lua and the room scripts): each transition made,
-- until one party claims it (ZREM answers 1) and sends its signal: the caller told, or a
-- sweep once it is left past its deadline (the caller never got the reply, or died). A
-- shard's outbox holds its users' user_online / user_offline (see LEDGER), a room's (<room
-- base>:o, in the room's slot) its room_entered / room_left (presence.outbox).
-- Scored by ``now``; the entry is "made|invisible|at|redis time|uid", unique per transition.
-- Returns the entry.
local function record(outbox, made, invisible, at, uid, now)
  local t = redis.call('TIME')
  local entry = made .. '|' .. invisible .. '|' .. at .. '|' .. t[1] .. '.' .. t[2] .. '|' .. uid
  redis.call('ZADD', outbox, now, entry)
  return entry
end
-- Claims the entries recorded at ``before`` or earlier, at most ``limit`` (their caller never
-- got the reply or died before claiming): removes and returns them, so exactly one claimer
-- sends each.
local function claim(outbox, before, limit)
  local entries = redis.call('ZRANGEBYSCORE', outbox, '-inf', before, 'LIMIT', 0, tonumber(limit))
  for _, entry in ipairs(entries) do
    redis.call('ZREM', outbox, entry)
  end
  return entries
end
