-- The entry readers of the room scripts that read (room_read.lua, room_page.lua): loaded after
-- room_common.lua. ``keep`` gathers each returned member's entry once in ``entries``.
local entries, seen = {}, {}
-- a member as listed: joined ms, invisible 0/1, meta (the last joined connection's) or ''
local function keep(list, uid, raw)
  local j, f = string.match(raw, '^(%w+)([%.!:;])')
  list[#list + 1] = uid
  list[#list + 1] = tonumber(j, 36)
  if not seen[uid] then
    seen[uid] = true
    local st, d = string.match(raw, '([%+%*%-~])(%x%x%x%x%x%x%x%x)%w+$')
    local meta = ''
    if st == '*' or st == '~' then meta = redis.call('HGET', T_KEY, uid .. '|' .. d) or '' end
    entries[#entries + 1] = uid
    entries[#entries + 1] = FLAGS[f][1]
    entries[#entries + 1] = meta
  end
end
-- joined ms and the end of the stay, without decoding the whole entry (one connection: one
-- match)
local function scan(raw)
  local j, x = string.match(raw, '^(%w+)[%.!:;][%+%*%-~]%x%x%x%x%x%x%x%x(%w+)$')
  if j then return tonumber(j, 36), tonumber(x, 36) end
  local rest
  j, rest = string.match(raw, '^(%w+)[%.!:;](.*)$')
  local s = 0
  for y in string.gmatch(rest, '[%+%*%-~]%x%x%x%x%x%x%x%x(%w+)') do
    local v = tonumber(y, 36)
    if v > s then s = v end
  end
  return tonumber(j, 36), s
end
-- whether an entry is public (its flag ":" or ";")
local function is_public(raw)
  return string.find(raw, '^%w+[:;]') ~= nil
end
-- the users named by ARGV[from] and after who are present now, kept in ``list``
local function keep_present(list, from, now)
  for n = from, #ARGV do
    local k = redis.call('HGET', idx_key(bucket(ARGV[n])), ARGV[n])
    local raw = k and redis.call('HGET', seg_key(k), ARGV[n])
    if raw and select(2, scan(raw)) > now then keep(list, ARGV[n], raw) end
  end
end
-- the invisible members present now
local function invisible_present(now)
  local invisible = {}
  for _, uid in ipairs(redis.call('ZRANGE', I_KEY, 0, -1)) do
    local k = redis.call('HGET', idx_key(bucket(uid)), uid)
    local raw = k and redis.call('HGET', seg_key(k), uid)
    if raw and select(2, scan(raw)) > now then invisible[#invisible + 1] = uid end
  end
  return invisible
end
