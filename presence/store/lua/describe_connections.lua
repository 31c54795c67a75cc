-- KEYS[1] bucket's connections, KEYS[2] bucket's expiries; ARGV member, 1 + TTL (see
-- connections). A user's live and not yet dropped connections as
-- "id:device_bit:idle:connected_at:heartbeat", and page views' devices as "h<bit>:bit:1:at:at"
-- (for inspection: tests, debugging).
local prefix = ARGV[1] .. ':'
local entries = {}
local members = redis.call('ZRANGEBYLEX', KEYS[2], '[' .. prefix, '(' .. ARGV[1] .. ';')
for _, member in ipairs(members) do
  local id = string.sub(member, #prefix + 12)
  local value = redis.call('HGET', KEYS[1], prefix .. id)
  if value then
    local b, idle, since, expiry = string.match(value, '^(%d+):(%d):(%d+):(%d+)')
    entries[#entries + 1] = table.concat({id, b, idle, since, expiry - ARGV[2]}, ':')
  end
end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local a = raw and {string.match(raw, AGGREGATE)}
if a and #a == 8 then
  for _, pb in ipairs({1, 2, 4}) do
    local at = a[5 + slot(pb)]
    if at ~= '0' then entries[#entries + 1] = table.concat({'h' .. pb, pb, 1, at, at}, ':') end
  end
end
return entries
