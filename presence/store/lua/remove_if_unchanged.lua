-- KEYS[1] bucket's seen, KEYS[2] bucket's connections, KEYS[3] bucket's expiries, KEYS[4..5]
-- the shard's ledger (online, hidden; see LEDGER), KEYS[6] the shard's outbox, KEYS[7] the
-- bucket's prior set (lua/prior.lua); ARGV now (s), then member1, score1, member2, score2...
-- Removes each member whose score is still the one read (so a user active again since is
-- kept), with everything left of its connections and its last seen of an earlier day (written
-- only with the seen entry, so unchanged too: the caller persisted it first); one still in the
-- ledger (no sweep made it offline: a site without live processes) leaves it, its offline
-- recorded in the outbox (so it is sent once even if this reply is lost: presence.outbox).
-- Returns {how many were removed, {member, invisible (0/1), offline since, outbox entry, ...}
-- of those that left the ledger}.
local now = tonumber(ARGV[1])
local removed = 0
local left = {}
for i = 2, #ARGV, 2 do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) == tonumber(ARGV[i + 1]) then
    local prefix = ARGV[i] .. ':'
    local first, last = '[' .. prefix, '(' .. ARGV[i] .. ';'
    for _, member in ipairs(redis.call('ZRANGEBYLEX', KEYS[3], first, last)) do
      redis.call('HDEL', KEYS[2], prefix .. string.sub(member, #prefix + 12))
    end
    redis.call('ZREMRANGEBYLEX', KEYS[3], first, last)
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[7], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    removed = removed + 1
    for k = 4, 5 do
      local was = redis.call('ZSCORE', KEYS[k], ARGV[i])
      if was then
        redis.call('ZREM', KEYS[k], ARGV[i])
        left[#left + 1] = ARGV[i]
        left[#left + 1] = k - 4
        left[#left + 1] = was
        left[#left + 1] = record(KEYS[6], -1, k - 4, was, ARGV[i], now)
      end
    end
  end
end
return {removed, left}
