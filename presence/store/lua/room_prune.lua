-- KEYS a room's (see room_common.lua); ARGV now (s), most members to remove, the newest
-- outbox entry to claim (s), the outbox's deadline (s).
-- Removes the members whose stay ended (crashed connections, the end of the grace) from the
-- segments due (up to 64 segments a call), in batches (a segment whose members all ended
-- deleted whole, one HDEL per index bucket, one ZINCRBY per second of the stays' ends), each
-- one's leave recorded in the room's outbox (one entry for the batch, outbox.lua),
-- sets each segment's exact next due time, and merges a segment left under a quarter full
-- into a neighbour that has room, so the listing order's segments stay full. Claims the
-- outbox entries nobody claimed by their deadline (outbox.lua). Returns {the room's next due
-- time (an entry left in the outbox keeps the room due, the batch made here too), the outbox
-- entries made (the batch of leaves: its users are the users removed), the entries claimed,
-- 1 if the room's last member was removed}.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local stale = claim(O_KEY, ARGV[3], limit)

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

-- What the batch removes, applied once each at the end (not per member: a sweep of a room
-- whose members all left at once removes whole segments; each redis.call costs ~1 us):
-- ``by_bucket`` index bucket -> its users, ``ends`` the seconds the stays ended, ``left``
-- second -> its users
local by_bucket, hidden, metas, ends, left, gone = {}, {}, {}, {}, {}, 0
-- 1: this sweep removed the room's last member (its keys gone, the outbox aside)
local emptied = 0
local ix = index_state()
local low, high = 2 ^ ix.L, 2 ^ (ix.L + 1)
local byte, sub = string.byte, string.sub
-- an entry's flag and connection state as bytes (string.byte: no pattern, no string made)
local FLAG_BYTES = {[46] = FLAGS['.'], [33] = FLAGS['!'], [58] = FLAGS[':'], [59] = FLAGS[';']}
local META_BYTES = {[42] = true, [126] = true}
-- an entry's end of stay, then whether it is invisible and public (0/1) and its connections'
-- meta digests (nil: none). The common entry, read by position: a join time of 8 base-36
-- digits (every millisecond from 1972 to 2059), its flag at byte 9, one connection (no room
-- after it for another: one takes 11 bytes at least), its expiry from byte 19; any other
-- decoded.
local function parse(raw)
  local n = #raw
  if n >= 19 and n <= 28 then
    local f, st = byte(raw, 9, 10)
    local flags = FLAG_BYTES[f]
    if flags then
      local s = tonumber(sub(raw, 19), 36)
      if META_BYTES[st] then return s, flags[1], flags[2], {sub(raw, 11, 18)} end
      return s, flags[1], flags[2], nil
    end
  end
  local e, digests = decode(raw), nil
  for _, c in ipairs(e.c) do
    if c.meta then
      digests = digests or {}
      digests[#digests + 1] = c.d
    end
  end
  return stay(e), e.i, e.o, digests
end
-- the member's removal noted (applied at the end)
local p = ix.p
local function forget(uid, s, inv, digests)
  -- its index bucket, as bucket() finds it (no cache: each user is met once)
  local h = user_hash(uid)
  local b = h % low
  if b < p then b = h % high end
  local list = by_bucket[b]
  if not list then
    list = {}
    by_bucket[b] = list
  end
  list[#list + 1] = uid
  if inv == 1 then hidden[#hidden + 1] = uid end
  if digests then
    for _, d in ipairs(digests) do metas[#metas + 1] = uid .. '|' .. d end
  end
  local at = left[s]
  if not at then
    at = {}
    left[s] = at
    ends[#ends + 1] = s
  end
  at[#at + 1] = uid
  gone = gone + 1
end

-- redis.call(command, key, ...each), 500 at a time
local function each_call(command, key, list)
  for n = 1, #list, 500 do
    redis.call(command, key, unpack(list, n, math.min(n + 499, #list)))
  end
end

local due = redis.call('ZRANGEBYSCORE', W_KEY, '-inf', now, 'LIMIT', 0, 64)
for _, k in ipairs(due) do
  if gone >= limit then break end
  local all = redis.call('HGETALL', seg_key(k))
  local earliest, out, opens = false, {}, 0
  for i = 1, #all, 2 do
    local s, inv, open, digests = parse(all[i + 1])
    if s <= now and gone < limit then
      forget(all[i], s, inv, digests)
      opens = opens + open
      out[#out + 1] = all[i]
    elseif not earliest or s < earliest then
      earliest = s
    end
  end
  if opens > 0 then opens_add(k, -opens) end
  if earliest then
    each_call('HDEL', seg_key(k), out)
    redis.call('ZADD', W_KEY, earliest, k)
    merge(k)
  elseif #out > 0 then
    -- the whole segment ended: its key goes at once
    redis.call('DEL', seg_key(k))
    redis.call('ZREM', G_KEY, k)
    redis.call('ZREM', W_KEY, k)
  end
end
if gone > 0 then
  for b, list in pairs(by_bucket) do each_call('HDEL', idx_key(int(b)), list) end
  if #hidden > 0 then each_call('ZREM', I_KEY, hidden) end
  if #metas > 0 then each_call('HDEL', T_KEY, metas) end
  local groups = {}
  table.sort(ends)
  for _, s in ipairs(ends) do
    ends_add(s, -#left[s])
    groups[#groups + 1] = {int(s), left[s]}
  end
  -- the latest end pruned: a join made late enters no earlier (room_join.lua)
  local latest = math.max(ends[#ends], index_state().z)
  if latest > index_state().z then redis.call('HSET', N_KEY, 'z', int(latest)) end
  -- the last segment gone: the room's last member (what n says too)
  if redis.call('HINCRBY', N_KEY, 'n', -gone) <= 0 and redis.call('EXISTS', G_KEY) == 0 then
    room_emptied(latest)
    emptied = 1
  end
  -- their leaves, one outbox entry for the batch (claimed whole: each sent once)
  MADE[#MADE + 1] = record_batch(O_KEY, -1, 0, groups, now)
end
return {room_next_due(tonumber(ARGV[4])), MADE, stale, emptied}
