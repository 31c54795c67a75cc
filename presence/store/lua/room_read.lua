-- KEYS a room's (see room_common.lua); ARGV now (s), members to read by join time, then the
-- users to look up (the viewer's contacts and blocks). Reads, never writes: members whose stay
-- ended count as gone. Returns {members present, the first members by join time present
-- (flat user, joined ms), the looked-up users present (flat user, joined ms), invisible
-- members present, entries (flat user, JSON) of the members returned}.
local now, first = tonumber(ARGV[1]), tonumber(ARGV[2])
local present = redis.call('ZCARD', KEYS[1]) - redis.call('ZCOUNT', KEYS[2], '-inf', now)
local function here(uid)
  local stay = redis.call('ZSCORE', KEYS[2], uid)
  return stay and tonumber(stay) > now
end
local page, found, entries, seen = {}, {}, {}, {}
local function keep(list, uid, joined)
  list[#list + 1] = uid
  list[#list + 1] = joined
  if not seen[uid] then
    seen[uid] = true
    entries[#entries + 1] = uid
    entries[#entries + 1] = redis.call('HGET', KEYS[3], uid) or ''
  end
end
if first > 0 then
  local members = redis.call('ZRANGE', KEYS[1], 0, first - 1, 'WITHSCORES')
  for n = 1, #members, 2 do
    if here(members[n]) then keep(page, members[n], members[n + 1]) end
  end
end
for n = 3, #ARGV do
  local joined = redis.call('ZSCORE', KEYS[1], ARGV[n])
  if joined and here(ARGV[n]) then keep(found, ARGV[n], joined) end
end
local invisible = {}
for _, uid in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  if here(uid) then invisible[#invisible + 1] = uid end
end
return {present, page, found, invisible, entries}
