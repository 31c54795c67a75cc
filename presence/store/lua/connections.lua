-- Where a user's connections are, in the bucket's "expiries" sorted set: all scores 0, ordered
-- by member "user:expiry:connection" (expiry = last heartbeat + 1 + TTL, ten digits: the TTL
-- counts from the end of the heartbeat's second), so one user's connections are a lexicographic
-- range, those gone by ``now`` (expiry <= now, as in domain.live_status: online while
-- now < heartbeat + 1 + TTL) a range below "user:<now + 1>".
local function expiry_member(prefix, expiry, id)
  return prefix .. string.format('%010d', expiry) .. ':' .. id
end
