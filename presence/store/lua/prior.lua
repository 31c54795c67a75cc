-- The last seen before today's (docs/redis-layout.md, ":prior"): a write that moves a user's
-- last seen into a later UTC day keeps the one it replaces in the bucket's prior set, so the
-- approximate last seen counts from it until midnight. ``prior`` is that set's key
-- (KeyScheme.prior_key), declared in the script's KEYS: the same hash tag as the seen set's.
local function keep_prior(prior, uid, old, ts)
  if not old then return end
  local old_ts = math.floor(math.abs(tonumber(old)) / SCORE_FACTOR)
  if math.floor(old_ts / 86400) < math.floor(ts / 86400) then
    redis.call('ZADD', prior, old_ts, uid)
  end
end
