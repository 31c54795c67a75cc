-- KEYS a room's (see room_common.lua); ARGV now (s), members to read by join time, which
-- ("all", or "public": the public members only, through the :p index of their segments), then
-- the users to look up (the viewer's contacts and blocks). Reads, never writes: members whose
-- stay ended count as gone. Returns {members present, the first members by join time present
-- (flat user, joined ms), the looked-up users present (flat user, joined ms), invisible
-- members present, entries (flat user, invisible 0/1, meta JSON or "") of the members
-- returned, 1 if the members read by join time were all there are (of those asked)}.
local now, first = tonumber(ARGV[1]), tonumber(ARGV[2])
local public = ARGV[3] == 'public'
local order = public and P_KEY or G_KEY
local page, found = {}, {}
-- segment after segment in join order until ``first`` are found; a segment's fields are in
-- join order unless a merge or a late join mixed them (then it is sorted)
-- Once ``first`` are found, the rest of the last one's millisecond is read too (members who
-- joined in one millisecond are listed by id: a read that stopped inside it could list the
-- wrong ones of them). Invisible members are returned as read but not counted in ``first``,
-- up to as many again: a read never takes more than twice ``first`` (a run of invisible
-- joins cannot make it read the whole room).
local from, rest, edge = 0, false, nil -- rest: a segment visited has members left unread
local counted = 0
if first == 0 then rest = redis.call('ZRANGE', order, 0, 0)[1] ~= nil end
while not rest do
  local k = redis.call('ZRANGE', order, from, from)[1]
  if not k then break end
  from = from + 1
  local all = redis.call('HGETALL', seg_key(k))
  local uids, js, fs, sts, ds, sorted, last = {}, {}, {}, {}, {}, true, -1
  for i = 1, #all, 2 do
    local j, s, f, st, d = scan(all[i + 1])
    if s > now and (not public or PUBLIC[f]) then
      local n = #uids + 1
      uids[n], js[n], fs[n], sts[n], ds[n] = all[i], j, f, st, d
      if j < last then sorted = false end
      last = j
    end
  end
  local ranks = {}
  for n = 1, #uids do ranks[n] = n end
  if not sorted then table.sort(ranks, function(a, b) return js[a] < js[b] end) end
  for _, n in ipairs(ranks) do
    if edge and js[n] > edge then
      rest = true
      break
    end
    keep(page, uids[n], js[n], fs[n], sts[n], ds[n])
    if not INVISIBLE[fs[n]] then counted = counted + 1 end
    if not edge and (counted >= first or #page >= 4 * first) then edge = js[n] end
  end
end
local complete = 0
if not rest and not redis.call('ZRANGE', order, from, from)[1] then complete = 1 end
keep_present(found, 4, now)
local invisible = invisible_present(now)
return {present(now), page, found, invisible, entries, complete}
