-- KEYS buckets' seen sets; ARGV[1] the lowest score that may still be live, in absolute value
-- (seconds * SCORE_FACTOR: an entry active, or signed off, before it is offline whatever its
-- flags), then for each key in turn how many members to read there, and those members.
-- Returns {member, score, member, score, ...} of the members present whose score may be live
-- (domain.live_status decides): a list of friends costs a reply of the online ones only.
local low = tonumber(ARGV[1])
local found = {}
local n = 0

local function keep(member, score)
  if score then
    local v = tonumber(score)
    if v >= low or -v >= low then
      found[n + 1] = member
      found[n + 2] = v
      n = n + 2
    end
  end
end

local at = 2
for _, key in ipairs(KEYS) do
  local count = tonumber(ARGV[at])
  local first = at + 1
  at = first + count
  if count == 1 then
    -- Most buckets hold one of the users asked for: ZSCORE needs no argument list and
    -- answers no table (keep() inlined: this runs thousands of times per read).
    local score = redis.call('ZSCORE', key, ARGV[first])
    if score then
      local v = tonumber(score)
      if v >= low or -v >= low then
        found[n + 1] = ARGV[first]
        found[n + 2] = v
        n = n + 2
      end
    end
  else
    -- unpack() is bounded by Lua's C stack: a huge bucket is read a slice at a time.
    for start = first, at - 1, 4000 do
      local last = math.min(start + 3999, at - 1)
      local scores = redis.call('ZMSCORE', key, unpack(ARGV, start, last))
      for i = 1, last - start + 1 do
        keep(ARGV[start + i - 1], scores[i])
      end
    end
  end
end
return found
