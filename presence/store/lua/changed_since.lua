-- KEYS a shard's change stamps, its epoch (stamp_changes.lua), its due, expiring and leased
-- schedules; ARGV[1] the page's time less the clocks' slack, ARGV[2] now plus that slack,
-- ARGV[3] the viewer's id, then user ids. Returns {epoch or false, id, kinds, id, kinds, ...}:
-- the users who may look different now than at ARGV[1], each with what kind of change since
-- (presence.domain.Kind's bits): a stamp since then, or a schedule (turning offline, a custom
-- status expiring) that fell due in between and may not be announced yet, or a claim by a
-- sweep under way. A user's stamp of any kind is its id; each kind's is '<bit>:<id>', a change
-- of relation with a viewer 'p:<length of id>:<id><viewer>', and a block made or lifted
-- between them 'b:<length of id>:<id><viewer>' (stamp_changes.lua).
local low, high, viewer = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local found = {redis.call('GET', KEYS[2])}
local ids = {}
for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
local stamps = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local due = redis.call('ZMSCORE', KEYS[3], unpack(ids))
local expiring = redis.call('ZMSCORE', KEYS[4], unpack(ids))
local leased = redis.call('ZMSCORE', KEYS[5], unpack(ids))
local function within(score)
  if not score then return false end
  local at = tonumber(score)
  return at >= low and at <= high
end
-- presence.domain.Kind's bits: live, activity, invisible, rules, relation, unknown, then a
-- permission changed per setting and class of viewers (64 to 16384), then a block (32768)
local BITS = {}
for b = 0, 15 do BITS[#BITS + 1] = 2 ^ b end
local RELATION, BLOCK = 16, 32768
local function has(kinds, bit) return kinds % (bit * 2) >= bit end
for i, id in ipairs(ids) do
  local kinds = 0
  local stamped = stamps[i] and tonumber(stamps[i]) >= low
  if stamped then
    local members = {}
    for _, bit in ipairs(BITS) do members[#members + 1] = string.format('%d', bit) .. ':' .. id end
    members[#members + 1] = 'p:' .. #id .. ':' .. id .. viewer
    members[#members + 1] = 'b:' .. #id .. ':' .. id .. viewer
    local pair, block = #members - 1, #members
    local scores = redis.call('ZMSCORE', KEYS[1], unpack(members))
    local function since(n) return scores[n] and tonumber(scores[n]) >= low end
    local kinded = false
    for b, bit in ipairs(BITS) do
      if since(b) then
        kinded = true
        -- A change of relation (a block) is the viewer's only if it was with them.
        if (bit ~= RELATION or since(pair)) and (bit ~= BLOCK or since(block)) then
          kinds = kinds + bit
        end
      end
    end
    if not kinded then kinds = 32 end -- stamped without its kind: everyone's
  end
  -- Schedules due: turning offline is LIVE (1), a custom status's end ACTIVITY (2), a sweep's
  -- claim either.
  local scheduled = 0
  if within(due[i]) or leased[i] then scheduled = 1 end
  if within(expiring[i]) or leased[i] then scheduled = scheduled + 2 end
  for _, bit in ipairs({1, 2}) do
    if has(scheduled, bit) and not has(kinds, bit) then kinds = kinds + bit end
  end
  -- Kinds 0: changed, but in no way this viewer can be told (a relation with another user).
  if stamped or kinds > 0 then
    found[#found + 1] = id
    found[#found + 1] = kinds
  end
end
return found
