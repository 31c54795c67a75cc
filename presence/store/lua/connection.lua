-- KEYS[1] bucket's seen, KEYS[2] bucket's connections (hash), KEYS[3] bucket's expiries;
-- ARGV member, op ("open", "beat", "close" or "expire"), connection id, device bit, idle (0/1), now,
-- start of the connection TTL (now - 1 - TTL: a heartbeat's TTL counts from the end of its
-- second, as in domain.offline_at), start of the online window (page views' devices, see TOUCH),
-- most live connections a user may have.
-- Each connection is one hash field "user:id" = "device_bit:idle:connected_at:expiry:unsettled"
-- (unsettled 1: its last write changed what the user shows, and its announcement may not have
-- been made; absent in entries of older versions, taken as 1) and one
-- member of the expiries set; the user's aggregate (field "user", see TOUCH) counts them, so a
-- heartbeat costs O(log n) whatever the user's connections. Connections gone by now are dropped
-- first (crash detection, at the moment domain.live_status counts them gone; a range query finds
-- them); the seen score is recomputed from the aggregate: latest heartbeat, the devices, idle
-- only if every connection is. When none is left the user signs off at their last activity (now
-- for a close). An open (or a beat) of a connection that is not live while the user has the
-- most live connections allowed is refused and changes nothing.
-- KEYS[4..7] the shard's ledger (online, hidden, invisible, outbox; see LEDGER), ARGV[10..12] offline
-- grace, connection TTL, online window. KEYS[8] the bucket's prior set (lua/prior.lua), KEYS[9]
-- the shard's ``:seeded`` marker (see settle).
-- KEYS[10] (an open only) the user's due schedule, ARGV[14] the due time of an open accepted: set
-- here, in the open's own round trip, and never for a refused open (it leaves no trace).
-- ARGV[13] the site's closes channel: when the user's last connection goes (a close, or an
-- expiry), "user:second" is published there, so that the page views' throttles of every process
-- learn it (presence.closes) without a read of their own.
-- KEYS[11], KEYS[12] (an open only) the shard's change stamps and their epoch (stamp_changes.lua),
-- ARGV[15] the time the open was sent, ARGV[16] the time before which stamps are forgotten: an
-- open that changes what the user shows (online, a device, crashed connections dropped) stamps
-- the change itself, at the later of ARGV[15] and Redis's time, in its own round trip.
-- ARGV[17] (a beat or an open) 1 if announcements of this user's earlier changes are still
-- being retried by the writing process: the connection stays unsettled.
-- Returns {old score or false, new score or false, live connections, refused (0/1), connections
-- dropped as crashed, made, invisible, at, outbox entry (see settle), stamped (0/1), crashed
-- connections dropped that were unsettled, the offline made first: its at and entry (see
-- settle)}.
local uid = ARGV[1]
local entry = false -- a beat's or an open's entry, written once its news is known
local op = ARGV[2]
local beat = op == 'beat' or op == 'open'
local id = ARGV[3]
local now = tonumber(ARGV[6])
local ttl = now - tonumber(ARGV[7])
local page_horizon = tonumber(ARGV[8])
local prefix = uid .. ':'
local field = prefix .. id
local first = '[' .. prefix
local gone_below = '(' .. prefix .. string.format('%010d', now + 1)
local old = redis.call('ZSCORE', KEYS[1], uid)
local o = old and tonumber(old) or 0
local old_ts = math.floor(math.abs(o) / SCORE_FACTOR)
local old_flags = math.abs(o) % SCORE_FACTOR
local raw = redis.call('HGET', KEYS[2], uid)
local a = raw and {string.match(raw, AGGREGATE)}
if not a or #a ~= 8 then a = {0, 0, 0, 0, 0, 0, 0, 0} end
for i = 1, 8 do a[i] = tonumber(a[i]) end
-- this connection's entry, unless it is gone already (a connection heard again after that
-- keeps its connected_at)
local cur = false
local since = now
if op ~= 'expire' then
  local value = redis.call('HGET', KEYS[2], field)
  if value then
    local b, idle, s, expiry = string.match(value, '^(%d+):(%d):(%d+):(%d+)')
    if b then since = s end
    if b and tonumber(expiry) > now then cur = {tonumber(b), idle, s, tonumber(expiry)} end
  end
end
if beat and not cur and a[1] >= tonumber(ARGV[9]) then
  local live = a[1] - redis.call('ZLEXCOUNT', KEYS[3], first, gone_below)
  if live >= tonumber(ARGV[9]) then return {old or false, old or false, live, 1, 0, 0, 0, false} end
end
-- crash detection: drop the connections not heard from for the TTL
local gone = redis.call('ZRANGEBYLEX', KEYS[3], first, gone_below)
-- (its process may have died between recording a change and announcing it: unsettled)
local crashed, unsettled = 0, 0
for _, member in ipairs(gone) do
  local f = prefix .. string.sub(member, #prefix + 12)
  local value = redis.call('HGET', KEYS[2], f)
  if value then
    crashed = crashed + 1
    local b, idle, settled = string.match(value, '^(%d+):(%d):%d+:%d+:?(%d?)$')
    if settled ~= '0' then unsettled = unsettled + 1 end
    b = tonumber(b)
    a[1] = math.max(a[1] - 1, 0)
    a[1 + slot(b)] = math.max(a[1 + slot(b)] - 1, 0)
    if idle == '0' then a[5] = math.max(a[5] - 1, 0) end
    redis.call('HDEL', KEYS[2], f)
  end
end
if #gone > 0 then redis.call('ZREMRANGEBYLEX', KEYS[3], first, gone_below) end
if cur and op ~= 'expire' then
  -- taken out; a beat puts it back with its new state
  a[1] = a[1] - 1
  a[1 + slot(cur[1])] = a[1 + slot(cur[1])] - 1
  if cur[2] == '0' then a[5] = a[5] - 1 end
end
if beat then
  local b = tonumber(ARGV[4])
  local expiry = now + ttl
  if cur and cur[4] ~= expiry then
    redis.call('ZREM', KEYS[3], expiry_member(prefix, cur[4], id))
  end
  if o > 0 and old_flags < FLAG_CONNECTED and old_ts > page_horizon then
    -- the first connection of a user seen by page views: their devices stay for the window
    for _, pb in ipairs({1, 2, 4}) do
      if bit.band(old_flags, pb) ~= 0 then a[5 + slot(pb)] = math.max(a[5 + slot(pb)], old_ts) end
    end
  end
  a[1] = a[1] + 1
  a[1 + slot(b)] = a[1 + slot(b)] + 1
  if ARGV[5] == '0' then a[5] = a[5] + 1 end
  redis.call('ZADD', KEYS[3], 0, expiry_member(prefix, expiry, id))
  entry = {b, ARGV[5], since, expiry}
elseif op == 'close' and cur then
  redis.call('ZREM', KEYS[3], expiry_member(prefix, cur[4], id))
  redis.call('HDEL', KEYS[2], field)
end
local mask = 0
for _, pb in ipairs({1, 2, 4}) do
  if a[5 + slot(pb)] <= page_horizon then a[5 + slot(pb)] = 0 end
  if a[1 + slot(pb)] > 0 or a[5 + slot(pb)] > 0 then mask = bit.bor(mask, pb) end
end
if a[1] > 0 then
  local value = table.concat(a, ':')
  if value ~= raw then redis.call('HSET', KEYS[2], uid, value) end
elseif raw then
  -- no connection left: page views' devices go with them (the score keeps the last ones)
  redis.call('HDEL', KEYS[2], uid)
end
local score = false
if a[1] > 0 then
  local ts = now
  if not beat then
    if o > 0 then
      ts = old_ts
    else
      local latest = redis.call('ZREVRANGEBYLEX', KEYS[3], '(' .. uid .. ';', first, 'LIMIT', 0, 1)
      if latest[1] then ts = tonumber(string.sub(latest[1], #prefix + 1, #prefix + 10)) - ttl end
    end
  end
  if o > 0 and old_ts > ts then ts = old_ts end
  score = ts * SCORE_FACTOR + FLAG_CONNECTED + mask
  if a[5] == 0 then score = score + FLAG_IDLE end
elseif o > 0 and old_flags >= FLAG_CONNECTED then
  local ts = old_ts
  if op == 'close' and now > ts then ts = now end
  score = -(ts * SCORE_FACTOR + old_flags % FLAG_CONNECTED)
  redis.call('PUBLISH', ARGV[13], uid .. ':' .. ts)
end
if score and score ~= o then
  redis.call('ZADD', KEYS[1], score, uid)
  keep_prior(KEYS[8], uid, old, math.floor(math.abs(score) / SCORE_FACTOR))
else
  score = old or false
end
if op == 'open' and KEYS[10] then redis.call('ZADD', KEYS[10], ARGV[14], uid) end
local made = settle({KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[9]}, uid, score, now, ARGV[10], ARGV[11], ARGV[12], old)
-- what a score shows besides its time: absent, signed off, or online with these flags
local function shown(s)
  if not s or s == 0 then return 0 end
  if s < 0 then return -1 - (-s % SCORE_FACTOR) end
  return 1 + s % SCORE_FACTOR
end
local news = unsettled > 0 or made[1] ~= 0 or shown(o) ~= shown(tonumber(score))
if entry then
  entry[5] = (news or ARGV[17] == '1') and 1 or 0
  redis.call('HSET', KEYS[2], field, table.concat(entry, ':'))
end
local stamped = 0
if op == 'open' and KEYS[11] and news then
  local t = redis.call('TIME')
  local at = string.format('%.6f', math.max(tonumber(ARGV[15]), t[1] + t[2] / 1000000))
  redis.call('SET', KEYS[12], at, 'NX')
  -- A change of any kind (the id) and a LIVE one (changed_since.lua).
  redis.call('ZADD', KEYS[11], 'GT', at, uid, at, '1:' .. uid)
  redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', '(' .. ARGV[16])
  stamped = 1
end
return {old or false, score and tostring(score) or false, a[1], 0, crashed, made[1], made[2], made[3], made[4], stamped, unsettled,
        made[5] or false, made[6] or false}
