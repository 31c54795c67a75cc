-- KEYS buckets' seen sets; ARGV[1] the lowest score that may still be live, in absolute value
-- (seconds * SCORE_FACTOR: an entry active, or signed off, before it is offline whatever its
-- flags); ARGV[2] how many of the keys come first holding one member each to read, then those
-- members, one per key; then for each further key in turn how many members to read there, and
-- those members. Returns {member, score, prior or false, member, ...} of the members present
-- whose score may be live (domain.live_status decides): a list of friends costs a reply of the
-- online ones. Prior: the last seen before today's (lua/prior.lua), from the bucket's prior set.
local low = tonumber(ARGV[1])
local singles = tonumber(ARGV[2])
local found = {}
local n = 0

-- the prior set's key is the seen set's with ':prior' for ':seen' (same slot; lua/prior.lua)
local function prior_of(seen, member)
  local prior = redis.call('ZSCORE', string.sub(seen, 1, -5) .. 'prior', member)
  return prior and tonumber(prior) or false
end

-- Most buckets hold one of the users asked for: ZSCORE, no count, no table for the answer.
for i = 1, singles do
  local score = redis.call('ZSCORE', KEYS[i], ARGV[2 + i])
  if score then
    local v = tonumber(score)
    if v >= low or -v >= low then
      found[n + 1] = ARGV[2 + i]
      found[n + 2] = v
      found[n + 3] = prior_of(KEYS[i], ARGV[2 + i])
      n = n + 3
    end
  end
end

local at = 3 + singles
for k = singles + 1, #KEYS do
  local count = tonumber(ARGV[at])
  local first = at + 1
  at = first + count
  -- unpack() is bounded by Lua's C stack: a huge bucket is read a slice at a time.
  for start = first, at - 1, 4000 do
    local last = math.min(start + 3999, at - 1)
    local scores = redis.call('ZMSCORE', KEYS[k], unpack(ARGV, start, last))
    for i = 1, last - start + 1 do
      local score = scores[i]
      if score then
        local v = tonumber(score)
        if v >= low or -v >= low then
          found[n + 1] = ARGV[start + i - 1]
          found[n + 2] = v
          found[n + 3] = prior_of(KEYS[k], ARGV[start + i - 1])
          n = n + 3
        end
      end
    end
  end
end
return found
