-- KEYS buckets' seen sets, then their prior sets in the same order; ARGV[1] the lowest score
-- that may still be live, in absolute value (seconds * SCORE_FACTOR: an entry active, or signed
-- off, before it is offline whatever its flags; 0: every entry); ARGV[2] the lowest such score
-- whose prior is read; ARGV[3] how many of the keys come first holding one member each to read,
-- then those members, one per key; then for each further key in turn how many members to read
-- there, and those members. Returns {member, score, prior or false, member, ...} of the members
-- present whose score may be live (domain.live_status decides): a list of friends costs a reply
-- of the online ones. Prior: the last seen before today's (lua/prior.lua), from the bucket's
-- prior set; only an entry of today counts from it (domain.approximate_before_today), so older
-- entries cost no read of it.
local low = tonumber(ARGV[1])
local prior_low = tonumber(ARGV[2])
local singles = tonumber(ARGV[3])
local buckets = #KEYS / 2
local found = {}
local n = 0

-- Most buckets hold one of the users asked for: ZSCORE, no count, no table for the answer.
for i = 1, singles do
  local member = ARGV[3 + i]
  local score = redis.call('ZSCORE', KEYS[i], member)
  if score then
    local v = tonumber(score)
    if v >= low or -v >= low then
      local prior = false
      if v >= prior_low or -v >= prior_low then
        prior = redis.call('ZSCORE', KEYS[buckets + i], member)
        prior = prior and tonumber(prior) or false
      end
      found[n + 1] = member
      found[n + 2] = v
      found[n + 3] = prior
      n = n + 3
    end
  end
end

local at = 4 + singles
for k = singles + 1, buckets do
  local count = tonumber(ARGV[at])
  local first = at + 1
  at = first + count
  -- unpack() is bounded by Lua's C stack: a huge bucket is read a slice at a time.
  for start = first, at - 1, 4000 do
    local last = math.min(start + 3999, at - 1)
    local scores = redis.call('ZMSCORE', KEYS[k], unpack(ARGV, start, last))
    -- the recent entries' places in the answer, and of those, the ones whose prior is read
    local asked, places = {}, {}
    for i = 1, last - start + 1 do
      local score = scores[i]
      if score then
        local v = tonumber(score)
        if v >= low or -v >= low then
          local member = ARGV[start + i - 1]
          found[n + 1] = member
          found[n + 2] = v
          found[n + 3] = false
          if v >= prior_low or -v >= prior_low then
            asked[#asked + 1] = member
            places[#places + 1] = n + 3
          end
          n = n + 3
        end
      end
    end
    if #asked > 0 then
      local priors = redis.call('ZMSCORE', KEYS[buckets + k], unpack(asked))
      for j = 1, #asked do
        if priors[j] then found[places[j]] = tonumber(priors[j]) end
      end
    end
  end
end
return found
