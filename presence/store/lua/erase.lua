-- A deleted user's live state goes, at once (docs/privacy.md, "Deleting a user"). KEYS[1] the
-- bucket's seen, KEYS[2] its prior, KEYS[3] its connections, KEYS[4] its expiries, KEYS[5..7] the
-- user's due, expiring and leased schedules, KEYS[8..11] the shard's ledger (online, hidden,
-- invisible, outbox; see LEDGER). ARGV[1] member, ARGV[2] now (s). Every key is of the user's
-- shard (one slot on a cluster). A user the ledger had online is made offline by this call (at
-- now, or when their time ran out if earlier): recorded in the outbox like any transition, so
-- user_offline is sent once. Returns {old score or false, false, made, invisible, at, outbox
-- entry} (see settle).
local uid = ARGV[1]
local now = tonumber(ARGV[2])
local prefix = uid .. ':'
local old = redis.call('ZSCORE', KEYS[1], uid)
redis.call('ZREM', KEYS[1], uid)
redis.call('ZREM', KEYS[2], uid)
-- the user's connections: one lexicographic range of the expiries ("<uid>:<expiry>:<id>")
local first, last = '[' .. prefix, '(' .. uid .. ';'
for _, member in ipairs(redis.call('ZRANGEBYLEX', KEYS[4], first, last)) do
  redis.call('HDEL', KEYS[3], prefix .. string.sub(member, #prefix + 12))
end
redis.call('ZREMRANGEBYLEX', KEYS[4], first, last)
redis.call('HDEL', KEYS[3], uid)
for i = 5, 7 do redis.call('ZREM', KEYS[i], uid) end
local made = {0, 0, false, false}
for i = 1, 2 do
  local was = redis.call('ZSCORE', KEYS[7 + i], uid)
  if was then
    redis.call('ZREM', KEYS[7 + i], uid)
    local at = tostring(math.min(tonumber(was), now))
    made = {-1, i - 1, at, record(KEYS[11], -1, i - 1, at, uid, now)}
  end
end
redis.call('SREM', KEYS[10], uid)
return {old or false, false, made[1], made[2], made[3], made[4]}
