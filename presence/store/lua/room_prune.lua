-- KEYS a room's (see room_common.lua); ARGV now (s), most members to remove, the newest
-- outbox entry to claim (s), the outbox's deadline (s).
-- Removes the members whose stay ended (crashed connections, the end of the grace) from the
-- segments due (up to 64 segments a call), each one's leave recorded in the room's outbox,
-- sets each segment's exact next due time, and merges a segment left under a quarter full
-- into a neighbour that has room, so the listing order's segments stay full. Claims the
-- outbox entries nobody claimed by their deadline (outbox.lua). Returns {the users removed,
-- the room's next due time (an entry left in the outbox keeps the room due), the outbox
-- entries made, the entries claimed}.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local stale = claim(O_KEY, ARGV[3], limit)
local gone = {}

local function merge(k)
  local size = redis.call('HLEN', seg_key(k))
  if size == 0 or size > SEGMENT / 4 or k == redis.call('HGET', N_KEY, 't') then return end
  local into = redis.call('ZREVRANGEBYSCORE', G_KEY, '(' .. k, '-inf', 'LIMIT', 0, 1)[1]
  if not into then into = redis.call('ZRANGEBYSCORE', G_KEY, '(' .. k, '+inf', 'LIMIT', 0, 1)[1] end
  if not into or redis.call('HLEN', seg_key(into)) + size > SEGMENT then return end
  local all = redis.call('HGETALL', seg_key(k))
  redis.call('HSET', seg_key(into), unpack(all))
  for i = 1, #all, 2 do redis.call('HSET', idx_key(bucket(all[i])), all[i], into) end
  local due = redis.call('ZSCORE', W_KEY, k)
  if due then redis.call('ZADD', W_KEY, 'LT', due, into) end
  local opens = redis.call('ZSCORE', P_KEY, k)
  if opens then
    opens_add(into, tonumber(opens) - tonumber(k) * OPEN_SHIFT)
    redis.call('ZREM', P_KEY, k)
  end
  redis.call('DEL', seg_key(k))
  redis.call('ZREM', G_KEY, k)
  redis.call('ZREM', W_KEY, k)
end

local due = redis.call('ZRANGEBYSCORE', W_KEY, '-inf', now, 'LIMIT', 0, 64)
for _, k in ipairs(due) do
  if #gone >= limit then break end
  local all = redis.call('HGETALL', seg_key(k))
  local earliest = false
  for i = 1, #all, 2 do
    local e = decode(all[i + 1])
    local s = stay(e)
    if s <= now and #gone < limit then
      e.k = k
      room_remove(all[i], e)
      room_made(-1, s, all[i], now)
      gone[#gone + 1] = all[i]
    elseif not earliest or s < earliest then
      earliest = s
    end
  end
  if earliest then
    redis.call('ZADD', W_KEY, earliest, k)
    merge(k)
  end
end
return {gone, room_next_due(tonumber(ARGV[4])), MADE, stale}
