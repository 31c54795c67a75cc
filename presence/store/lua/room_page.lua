-- KEYS a room's (see room_common.lua); ARGV now (s), members to read, the join time (ms) a
-- page starts at (-1: the room's start), then the users to look up (the viewer's contacts and
-- blocks). Reads, never writes: members whose stay ended count as gone. A page of the room
-- (docs/rooms.md, "Paging"): the members present who joined at or after ``after``, at least
-- ``first`` of them unless the room ends first (invisible members returned as read, not
-- counted: room_reading.lua's INVISIBLE, up to as many again: a page never reads more than
-- twice ``first``), and every member who joined in the same
-- millisecond as the last one returned (the caller orders ties by id: a page never splits a
-- millisecond it did not read whole). The segment to start from is found by bisection (the
-- segments are in join order), so a page deep in the room costs what the first does.
-- Returns {members present, the page (flat user, joined ms), the looked-up users present
-- (flat user, joined ms), invisible members present, entries (flat user, invisible 0/1, meta
-- JSON or "") of the members returned, 1 if the page reached the room's end}.
local now, first, after = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local page, found = {}, {}
-- the earliest join time in the segment at this place of the order (its stays ended or not)
local function earliest(at)
  local k = redis.call('ZRANGE', G_KEY, at, at)[1]
  local m = false
  for _, raw in ipairs(redis.call('HVALS', seg_key(k))) do
    local j = tonumber(string.match(raw, '^(%w+)'), 36)
    if not m or j < m then m = j end
  end
  return m
end
-- the last segment holding a member who joined before ``after``: every earlier one holds
-- only such members
local from = 0
if after >= 0 then
  local lo, hi = 0, redis.call('ZCARD', G_KEY) - 1
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local m = earliest(mid)
    if m and m < after then
      from, lo = mid, mid + 1
    else
      hi = mid - 1
    end
  end
end
local uids, parsed, js, done = {}, {}, {}, 1
local counted = {} -- the join times of the members read that count towards ``first``
while true do
  local k = redis.call('ZRANGE', G_KEY, from, from)[1]
  if not k then break end
  from = from + 1
  local all = redis.call('HGETALL', seg_key(k))
  local last = -1
  for i = 1, #all, 2 do
    local j, s, f, st, d = scan(all[i + 1])
    if j > last then last = j end
    if s > now and j >= after then
      uids[#uids + 1], parsed[#parsed + 1], js[#js + 1] = all[i], {f, st, d}, j
      if not INVISIBLE[f] then counted[#counted + 1] = j end
    end
  end
  if #counted >= first or #js >= 2 * first then
    -- the first-th counted member's join time, or the (2 first)-th member's, the earlier
    local cut
    if #counted >= first then
      table.sort(counted)
      cut = counted[first]
    end
    if #js >= 2 * first then
      local all = {}
      for n = 1, #js do all[n] = js[n] end
      table.sort(all)
      if not cut or all[2 * first] < cut then cut = all[2 * first] end
    end
    -- Later segments hold members who joined at ``last`` or later: once the cut's join
    -- time is earlier, no later member comes before it or shares its millisecond.
    if cut < last then
      done = 0
      local kept_u, kept_p, kept_j = {}, {}, {}
      for n = 1, #js do
        if js[n] <= cut then
          kept_u[#kept_u + 1], kept_p[#kept_p + 1], kept_j[#kept_j + 1] = uids[n], parsed[n], js[n]
        end
      end
      uids, parsed, js = kept_u, kept_p, kept_j
      break
    end
  end
end
for n = 1, #uids do keep(page, uids[n], js[n], unpack(parsed[n])) end
keep_present(found, 4, now)
local invisible = invisible_present(now)
return {present(now), page, found, invisible, entries, done}
