-- KEYS a shard's change stamps, its epoch (stamp_changes.lua), its due, expiring and leased
-- schedules; ARGV[1] the page's time less the clocks' slack, ARGV[2] now plus that slack, then
-- user ids. Returns {epoch or false, ids...}: the users who may look different now than at
-- ARGV[1]: a stamp since then, or a schedule (turning offline, a custom status expiring) that
-- fell due in between and may not be announced yet, or a claim by a sweep under way.
local low, high = tonumber(ARGV[1]), tonumber(ARGV[2])
local found = {redis.call('GET', KEYS[2])}
local ids = {}
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
local stamps = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local due = redis.call('ZMSCORE', KEYS[3], unpack(ids))
local expiring = redis.call('ZMSCORE', KEYS[4], unpack(ids))
local leased = redis.call('ZMSCORE', KEYS[5], unpack(ids))
local function within(score)
  if not score then return false end
  local at = tonumber(score)
  return at >= low and at <= high
end
for i, id in ipairs(ids) do
  if (stamps[i] and tonumber(stamps[i]) >= low) or within(due[i]) or within(expiring[i])
      or leased[i] then
    found[#found + 1] = id
  end
end
return found
