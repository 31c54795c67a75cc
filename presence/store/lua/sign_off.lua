-- KEYS[1] bucket; ARGV member, now, device bit, start of the connection TTL. The device signs
-- off (logout); the last one signing off turns the score negative (signed off at that time,
-- keeping the devices and idle flag shown during the grace). Live connections keep the user
-- online. KEYS[2..5] the shard's ledger (online, hidden, invisible, outbox; see LEDGER), ARGV[5..7]
-- offline grace, connection TTL, online window. Returns {old score or false, new score, made,
-- invisible, at, outbox entry, the offline made first: its at and entry} (see settle). KEYS[6]
-- the bucket's prior set (lua/prior.lua), KEYS[7] the shard's ``:seeded`` marker (see settle).
-- ARGV[8] the closes channel: a sign-off that signs the user off is published there as a last
-- connection's close is (presence.closes), so that no process's throttle keeps another session
-- of the user unwritten.
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
local now = tonumber(ARGV[2])
local bit_ = tonumber(ARGV[3])
local ts = now
local flags = 0
local mask = 0
local connected = false
if old then
  local o = tonumber(old)
  if o > 0 then
    local old_ts = math.floor(o / SCORE_FACTOR)
    flags = o % SCORE_FACTOR
    if old_ts > ts then ts = old_ts end
    connected = flags >= FLAG_CONNECTED and old_ts > tonumber(ARGV[4])
    mask = bit.band(flags % DEVICE_MASK_LIMIT, bit.bnot(bit_))
  end
end
local score
if old and tonumber(old) < 0 then
  -- signed off already (a sign-off run late, or twice): where the last write left the user
  score = tonumber(old)
elseif connected then
  score = ts * SCORE_FACTOR + flags
elseif mask == 0 then
  score = -(ts * SCORE_FACTOR + flags % FLAG_CONNECTED)
else
  score = ts * SCORE_FACTOR + mask
end
redis.call('ZADD', KEYS[1], score, ARGV[1])
if score < 0 and not (old and tonumber(old) < 0) then
  redis.call('PUBLISH', ARGV[8], ARGV[1] .. ':' .. now)
end
keep_prior(KEYS[6], ARGV[1], old, ts)
local made = settle({KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7]}, ARGV[1], score, now, ARGV[5], ARGV[6], ARGV[7], old)
return {old or false, tostring(score), made[1], made[2], made[3], made[4], made[5] or false,
  made[6] or false}
