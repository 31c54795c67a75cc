-- The entry readers of the room scripts that read (room_read.lua, room_page.lua): loaded after
-- room_common.lua. ``keep`` gathers each returned member's entry once in ``entries``.
local entries, seen = {}, {}
local match, gmatch = string.match, string.gmatch
-- an entry read in one match (one connection, the common entry), else decoded: joined ms,
-- the end of the stay, the flag, and the state and digest of its last joined connection
local function scan(raw)
  local j, f, st, d, x = match(raw, '^(%w+)([%.!:;])([%+%*%-~])(%x%x%x%x%x%x%x%x)(%w+)$')
  if j then return tonumber(j, 36), tonumber(x, 36), f, st, d end
  local rest
  j, f, rest = match(raw, '^(%w+)([%.!:;])(.*)$')
  local s = 0
  for c, e, y in gmatch(rest, '([%+%*%-~])(%x%x%x%x%x%x%x%x)(%w+)') do
    local v = tonumber(y, 36)
    if v > s then s = v end
    st, d = c, e
  end
  return tonumber(j, 36), s, f, st, d
end
-- whether a flag is a public member's (":" or ";")
local PUBLIC = {[':'] = true, [';'] = true}
-- whether a flag is an invisible member's ("!" or ";"): never listed nor counted, so a read's
-- reach (its ``first``) counts only the others, and whom it lists where never depends on them
local INVISIBLE = {['!'] = true, [';'] = true}
-- a member as listed (from scan: joined ms, flag, its last connection's state and digest):
-- joined ms, invisible 0/1, meta (the last joined connection's) or ''
local function keep(list, uid, j, f, st, d)
  list[#list + 1] = uid
  list[#list + 1] = j
  if not seen[uid] then
    seen[uid] = true
    local meta = ''
    if st == '*' or st == '~' then meta = redis.call('HGET', T_KEY, uid .. '|' .. d) or '' end
    entries[#entries + 1] = uid
    entries[#entries + 1] = FLAGS[f][1]
    entries[#entries + 1] = meta
  end
end
-- the users named by ARGV[from] and after who are present now, kept in ``list``
local function keep_present(list, from, now)
  for n = from, #ARGV do
    local k = redis.call('HGET', idx_key(bucket(ARGV[n])), ARGV[n])
    local raw = k and redis.call('HGET', seg_key(k), ARGV[n])
    if raw then
      local j, s, f, st, d = scan(raw)
      if s > now then keep(list, ARGV[n], j, f, st, d) end
    end
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
