-- KEYS a room's (see room_common.lua); ARGV now (s), members to read by join time, then the
-- users to look up (the viewer's contacts and blocks). Reads, never writes: members whose stay
-- ended count as gone. Returns {members present, the first members by join time present
-- (flat user, joined ms), the looked-up users present (flat user, joined ms), invisible
-- members present, entries (flat user, invisible 0/1, meta JSON or "") of the members
-- returned}.
local now, first = tonumber(ARGV[1]), tonumber(ARGV[2])
local page, found, entries, seen = {}, {}, {}, {}
-- a member as listed: joined ms, invisible 0/1, meta (the last joined connection's) or ''
local function keep(list, uid, raw)
  local j, f = string.match(raw, '^(%w+)([%.!])')
  list[#list + 1] = uid
  list[#list + 1] = tonumber(j, 36)
  if not seen[uid] then
    seen[uid] = true
    local st, d = string.match(raw, '([%+%*%-~])(%x%x%x%x%x%x%x%x)%w+$')
    local meta = ''
    if st == '*' or st == '~' then meta = redis.call('HGET', T_KEY, uid .. '|' .. d) or '' end
    entries[#entries + 1] = uid
    entries[#entries + 1] = (f == '!') and 1 or 0
    entries[#entries + 1] = meta
  end
end
-- joined ms and the end of the stay, without decoding the whole entry (one connection: one
-- match)
local function scan(raw)
  local j, x = string.match(raw, '^(%w+)[%.!][%+%*%-~]%x%x%x%x%x%x%x%x(%w+)$')
  if j then return tonumber(j, 36), tonumber(x, 36) end
  local rest
  j, rest = string.match(raw, '^(%w+)[%.!](.*)$')
  local s = 0
  for y in string.gmatch(rest, '[%+%*%-~]%x%x%x%x%x%x%x%x(%w+)') do
    local v = tonumber(y, 36)
    if v > s then s = v end
  end
  return tonumber(j, 36), s
end
-- segment after segment in join order until ``first`` are found; a segment's fields are in
-- join order unless a merge or a late join mixed them (then it is sorted)
local from = 0
while #page < 2 * first do
  local k = redis.call('ZRANGE', G_KEY, from, from)[1]
  if not k then break end
  from = from + 1
  local all = redis.call('HGETALL', seg_key(k))
  local uids, raws, js, sorted, last = {}, {}, {}, true, -1
  for i = 1, #all, 2 do
    local j, s = scan(all[i + 1])
    if s > now then
      uids[#uids + 1], raws[#raws + 1], js[#js + 1] = all[i], all[i + 1], j
      if j < last then sorted = false end
      last = j
    end
  end
  local order = {}
  for n = 1, #uids do order[n] = n end
  if not sorted then table.sort(order, function(a, b) return js[a] < js[b] end) end
  for _, n in ipairs(order) do
    if #page >= 2 * first then break end
    keep(page, uids[n], raws[n])
  end
end
for n = 3, #ARGV do
  local k = redis.call('HGET', idx_key(bucket(ARGV[n])), ARGV[n])
  local raw = k and redis.call('HGET', seg_key(k), ARGV[n])
  if raw and select(2, scan(raw)) > now then keep(found, ARGV[n], raw) end
end
local invisible = {}
for _, uid in ipairs(redis.call('ZRANGE', I_KEY, 0, -1)) do
  local k = redis.call('HGET', idx_key(bucket(uid)), uid)
  local raw = k and redis.call('HGET', seg_key(k), uid)
  if raw and select(2, scan(raw)) > now then invisible[#invisible + 1] = uid end
end
return {present(now), page, found, invisible, entries}
