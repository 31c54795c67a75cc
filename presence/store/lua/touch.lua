-- KEYS[1] bucket's seen, KEYS[2] its connections; ARGV member, now, device bit, start of the
-- online window, start of the connection TTL (now - 1 - TTL, see CONNECTION) (activity at a
-- start is already past it, as in domain.live_status: online while now < activity + window).
-- KEYS[3..6] the shard's ledger (online, hidden, invisible, outbox; see LEDGER), ARGV[6..8] offline
-- grace, connection TTL, online window. Returns {old score or false, new score, made, invisible,
-- at, outbox entry, the offline made first: its at and entry} (see settle). Never moves activity
-- backwards; keeps the device kinds of the current online stretch and the "connected" flag of
-- live connections; a request is input, so it clears "idle". KEYS[7] the bucket's prior set
-- (lua/prior.lua), KEYS[8] the shard's ``:seeded`` marker (lua/ledger.lua's ``seeded``).
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
local now = tonumber(ARGV[2])
local mask = tonumber(ARGV[3])
local connected = 0
local ts = now
if old then
  local o = tonumber(old)
  if o > 0 then
    local old_ts = math.floor(o / SCORE_FACTOR)
    local flags = o % SCORE_FACTOR
    if old_ts > tonumber(ARGV[4]) then mask = bit.bor(flags % DEVICE_MASK_LIMIT, mask) end
    if flags >= FLAG_CONNECTED and old_ts > tonumber(ARGV[5]) then connected = FLAG_CONNECTED end
    if old_ts > ts then ts = old_ts end
  end
end
if connected == FLAG_CONNECTED then
  -- Live connections recompute the devices on each heartbeat: the page view's device kind is
  -- kept in the user's aggregate beside them, a pseudo-connection that lasts the online window.
  local agg = redis.call('HGET', KEYS[2], ARGV[1])
  local a = agg and {string.match(agg, AGGREGATE)}
  if a and #a == 8 then
    a[5 + slot(tonumber(ARGV[3]))] = tostring(now)
    redis.call('HSET', KEYS[2], ARGV[1], table.concat(a, ':'))
  end
end
local score = ts * SCORE_FACTOR + connected + mask
redis.call('ZADD', KEYS[1], score, ARGV[1])
keep_prior(KEYS[7], ARGV[1], old, ts)
local made = settle({KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8]}, ARGV[1], score, now, ARGV[6], ARGV[7], ARGV[8], old)
return {old or false, tostring(score), made[1], made[2], made[3], made[4], made[5] or false,
  made[6] or false}
