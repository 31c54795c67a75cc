-- The last seen before today's (docs/redis-layout.md, ":prior"): a write that moves a user's
-- last seen into a later UTC day keeps the one it replaces in the bucket's prior set, so the
-- approximate last seen counts from it until midnight. Its key is the seen set's with ':prior'
-- for ':seen' (KeyScheme.prior_key): the same hash tag, so the same slot.
local function keep_prior(seen, uid, old, ts)
  if not old then return end
  local old_ts = math.floor(math.abs(tonumber(old)) / SCORE_FACTOR)
  if math.floor(old_ts / 86400) < math.floor(ts / 86400) then
    redis.call('ZADD', string.sub(seen, 1, -5) .. 'prior', old_ts, uid)
  end
end
