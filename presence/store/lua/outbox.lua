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
-- Records many transitions of one kind at once (a sweep's leaves) as one entry, claimed
-- whole by one party who sends them all: "made|invisible|*|redis time|" then, per ``at`` of
-- ``groups`` (each {at, {uid, ...}}), "at:count:uid:...:uid" joined by ":" (an encoded uid
-- holds no ":"). Returns the entry.
local function record_batch(outbox, made, invisible, groups, now)
  local t = redis.call('TIME')
  local parts = {}
  for _, group in ipairs(groups) do
    parts[#parts + 1] = group[1] .. ':' .. #group[2] .. ':' .. table.concat(group[2], ':')
  end
  local entry = made .. '|' .. invisible .. '|*|' .. t[1] .. '.' .. t[2] .. '|'
    .. table.concat(parts, ':')
  redis.call('ZADD', outbox, now, entry)
  return entry
end
-- Claims the entries recorded at ``before`` or earlier, at most ``limit`` (their caller never
-- got the reply or died before claiming): removes and returns them, so exactly one claimer
-- sends each.
local function claim(outbox, before, limit)
  local entries = redis.call('ZRANGEBYSCORE', outbox, '-inf', before, 'LIMIT', 0, tonumber(limit))
  -- one ZREM per 500 (not one per entry: a sweep claims up to its limit at once)
  for n = 1, #entries, 500 do
    redis.call('ZREM', outbox, unpack(entries, n, math.min(n + 499, #entries)))
  end
  return entries
end
