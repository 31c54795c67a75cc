-- Shared by the room scripts. KEYS of a room: [1] members by join time (sorted set, score =
-- join time in ms), [2] members by the end of their stay (sorted set, score = seconds),
-- [3] each member's entry (hash: user -> JSON {"i": invisible 0/1, "c": {connection:
-- [expiry, joined ms, meta JSON text or false, left 0/1]}}), [4] invisible members (set).
-- A connection counts until its expiry (heartbeat + CONNECTION_TTL); one that left while it
-- was its user's last keeps the user for OFFLINE_GRACE (its expiry becomes the end of the
-- grace, "left" set). A member's stay ends at the latest expiry of its connections.
local function room_entry(uid)
  local raw = redis.call('HGET', KEYS[3], uid)
  if not raw then return nil end
  return cjson.decode(raw)
end

-- the meta shown with a member: that of its connection that joined last
local function room_shown(e)
  local best, meta = -1, false
  for _, c in pairs(e.c) do
    if c[2] > best then best, meta = c[2], c[3] end
  end
  return meta
end

-- connections whose expiry passed are dropped; the end of the member's stay (0: none left)
local function room_stay(e, now)
  local stay = 0
  for id, c in pairs(e.c) do
    if c[1] <= now then e.c[id] = nil elseif c[1] > stay then stay = c[1] end
  end
  return stay
end

local function room_remove(uid)
  redis.call('ZREM', KEYS[1], uid)
  redis.call('ZREM', KEYS[2], uid)
  redis.call('HDEL', KEYS[3], uid)
  redis.call('SREM', KEYS[4], uid)
end

-- the next time a member's stay ends (false: the room is empty)
local function room_next_due()
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return first[2] or false
end
