-- KEYS the room's summary hash (<base>:n, see room_common.lua); ARGV now (s). Returns the
-- members present: those recorded (n) minus those whose stay ended and who are not swept yet
-- (the per-second counts of :e up to now): the count in one call, O(log n + the seconds not
-- yet swept). Standalone: room_common.lua's definitions would cost Redis more than this count.
local SHIFT = 2097152 -- as room_common.lua and presence.store.plans.rooms.STAY_SHIFT
local now = tonumber(ARGV[1])
local n = tonumber(redis.call('HGET', KEYS[1], 'n')) or 0
local ended = redis.call('ZRANGEBYSCORE', string.sub(KEYS[1], 1, -3) .. ':e', '-inf',
  string.format('%d', (now + 1) * SHIFT - 1), 'WITHSCORES')
for i = 1, #ended, 2 do n = n - (tonumber(ended[i + 1]) - tonumber(ended[i]) * SHIFT) end
if n < 0 then n = 0 end
return n
