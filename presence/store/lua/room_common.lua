-- Shared by the room scripts. KEYS[1] is the room's summary hash (<base>:n); every other key
-- of the room is <base>:<part>, in the same slot (the room is the hash tag), built here. The
-- layout keeps every key small enough for Redis's compact encodings (listpacks, ~10x smaller
-- than skip lists and hash tables), whatever the room's size (docs/redis-layout.md):
--   :n     hash: n = members recorded, t = the tail segment, L / p = the index's level and
--          split pointer (linear hashing), z = the latest end of a stay the sweep pruned (a
--          member entering anew enters no earlier: its signals keep their order)
--   :z     string: z, kept ROOM_Z_KEEP seconds once the room is empty (its other keys deleted), so
--          that a join run late into the emptied room is ordered after the stays pruned; moved
--          back into :n when a member enters
--   :s:<k> hash, segment k of at most SEGMENT members in join order: user -> entry (below)
--   :u:<b> hash, index bucket b (by a hash of the user): user -> its segment
--   :g     sorted set: segments by number (the listing order)
--   :w     sorted set: segments by the earliest end of a stay in them (never later)
--   :e     sorted set: member = a second, score = second * SHIFT + members whose stay ends then
--          (the count: n minus the stays ended, O(log n + seconds not yet swept))
--   :t     hash: user|connection digest -> that connection's meta (only when it has one)
--   :v     sorted set (all scores 0, a listpack up to 128): invisible members
--   :o     sorted set: the room's outbox (outbox.lua), its entries and leaves not yet claimed:
--          "1" a user entered the room (its first connection), "-1" left it (its stay ended,
--          or it was refused); not one of the room's keys deleted with its last member
--   :p     sorted set: the segments holding public members (below), score = segment * 256 +
--          how many (the segments in the listing order: a stranger's read visits those only)
-- An entry: <joined ms, base 36><flag> then, per connection in join order
-- (the last joined last), <state><8 hex digits of the connection id's SHA-1><expiry, base
-- 36>; flag "." visible, "!" invisible, ":" visible and public, ";" invisible and public
-- (public: the member's online status may be shown to everyone, so a stranger's read must
-- consider them; the resolver still decides); state "+" here, "*" here with meta, "-" left,
-- "~" left with meta. A connection counts
-- until its expiry (heartbeat + CONNECTION_TTL); one that left while it was its user's last
-- keeps the user for OFFLINE_GRACE (its expiry becomes the end of the grace, "left" set). A
-- member's stay ends at the latest expiry of its connections.
local SEGMENT = 128
local LOAD = 64
local SHIFT = 2097152
local BASE = string.sub(KEYS[1], 1, -3)
local N_KEY, E_KEY, G_KEY, W_KEY = KEYS[1], BASE .. ':e', BASE .. ':g', BASE .. ':w'
local T_KEY, I_KEY, O_KEY = BASE .. ':t', BASE .. ':v', BASE .. ':o'
local P_KEY, OPEN_SHIFT = BASE .. ':p', 256
local Z_KEY = BASE .. ':z'
local DIGITS = '0123456789abcdefghijklmnopqrstuvwxyz'

local function seg_key(k) return BASE .. ':s:' .. k end
local function idx_key(b) return BASE .. ':u:' .. b end
local function int(n) return string.format('%d', n) end

-- numbers whose base-36 text is known already (the caller's, or read from an entry): each
-- digit of b36 below costs a string operation, a join's two numbers a tenth of its script
local B36 = {}
local function b36(n)
  n = math.floor(n)
  local known = B36[n]
  if known then return known end
  if n <= 0 then return '0' end
  local s = ''
  while n > 0 do
    local r = n % 36
    s = string.sub(DIGITS, r + 1, r + 1) .. s
    n = (n - r) / 36
  end
  return s
end

local function digest(s) return string.sub(redis.sha1hex(s), 1, 8) end

-- the index (linear hashing: buckets split one at a time as the room grows, each <= ~2 LOAD)
local index
local function index_state()
  if not index then
    local v = redis.call('HMGET', N_KEY, 'L', 'p', 't', 'z', 'n')
    index = {
      L = tonumber(v[1]) or 0, p = tonumber(v[2]) or 0, t = tonumber(v[3]) or 0,
      z = tonumber(v[4]) or 0,
    }
    if not v[5] then
      -- an empty room: z as kept when it emptied (room_emptied), if lately
      index.z = tonumber(redis.call('GET', Z_KEY)) or 0
      index.kept = index.z > 0
    end
  end
  return index
end

-- a user's hash for its index bucket: an id that is a whole number below 2^32 by Fibonacci
-- hashing (the fraction of id * 0.618..., which spreads ids one after another and ids in any
-- stride alike; exact in doubles, so every script gets the same), any other id the first 8
-- hex digits of its SHA-1 (a third of a prune's time per member: integer ids skip it)
local function user_hash(uid)
  local n = tonumber(uid)
  if n and n >= 0 and n < 4294967296 and n % 1 == 0 then
    return math.floor(n * 0.6180339887498949 % 1 * 4294967296)
  end
  return tonumber(string.sub(redis.sha1hex(uid), 1, 8), 16)
end

local hashes = {}
local function bucket(uid, L, p)
  local h = hashes[uid]
  if not h then
    h = user_hash(uid)
    hashes[uid] = h
  end
  if not L then
    local ix = index_state()
    L, p = ix.L, ix.p
  end
  local a = h % 2 ^ L
  if a < p then a = h % 2 ^ (L + 1) end
  return int(a)
end

local function maybe_split(n)
  local ix = index_state()
  if n <= LOAD * (2 ^ ix.L + ix.p) then return end
  local from, to = idx_key(int(ix.p)), idx_key(int(ix.p + 2 ^ ix.L))
  local all = redis.call('HGETALL', from)
  local moved, names = {}, {}
  for i = 1, #all, 2 do
    if bucket(all[i], ix.L + 1, 0) ~= int(ix.p) then
      moved[#moved + 1] = all[i]
      moved[#moved + 1] = all[i + 1]
      names[#names + 1] = all[i]
    end
  end
  if #names > 0 then
    redis.call('HSET', to, unpack(moved))
    redis.call('HDEL', from, unpack(names))
  end
  ix.p = ix.p + 1
  if ix.p == 2 ^ ix.L then ix.L, ix.p = ix.L + 1, 0 end
  redis.call('HSET', N_KEY, 'L', ix.L, 'p', ix.p)
end

local FLAGS = {['.'] = {0, 0}, ['!'] = {1, 0}, [':'] = {0, 1}, [';'] = {1, 1}}

-- a number given in base 36 (its text remembered for b36)
local function from_b36(text)
  local n = tonumber(text, 36)
  B36[n] = text
  return n
end

local function decode(raw)
  local j, f, rest = string.match(raw, '^(%w+)([%.!:;])(.*)$')
  local e = {j = from_b36(j), i = FLAGS[f][1], o = FLAGS[f][2], c = {}}
  for st, d, x in string.gmatch(rest, '([%+%*%-~])(%x%x%x%x%x%x%x%x)(%w+)') do
    e.c[#e.c + 1] = {d = d, x = from_b36(x), left = (st == '-' or st == '~'),
                     meta = (st == '*' or st == '~')}
  end
  return e
end

local function encode(e)
  local flag
  if e.o == 1 then flag = e.i == 1 and ';' or ':' else flag = e.i == 1 and '!' or '.' end
  local parts = {b36(e.j), flag}
  for _, c in ipairs(e.c) do
    local st
    if c.left then st = c.meta and '~' or '-' else st = c.meta and '*' or '+' end
    parts[#parts + 1] = st .. c.d .. b36(c.x)
  end
  return table.concat(parts)
end

-- the end of the member's stay: the latest expiry of its connections (0: none)
local function stay(e)
  local s = 0
  for _, c in ipairs(e.c) do if c.x > s then s = c.x end end
  return s
end

-- the meta shown with a member: that of its connection that joined last (false: none)
local function shown(uid, e)
  local last = e.c[#e.c]
  if not last or not last.meta then return false end
  return redis.call('HGET', T_KEY, uid .. '|' .. last.d) or false
end

-- the member's entry (with .k its segment), or nil
local function load(uid)
  local k = redis.call('HGET', idx_key(bucket(uid)), uid)
  if not k then return nil end
  local raw = redis.call('HGET', seg_key(k), uid)
  if not raw then return nil end
  local e = decode(raw)
  e.k = k
  return e
end

-- members whose stay ends at ``second``: moved by ``delta`` (one ZINCRBY when the second is
-- already there, as it mostly is in a busy room)
local function ends_add(second, delta)
  if second <= 0 or delta == 0 then return end
  local member = int(second)
  local n = tonumber(redis.call('ZINCRBY', E_KEY, delta, member))
  if n == delta then
    n = tonumber(redis.call('ZINCRBY', E_KEY, int(second * SHIFT), member))
  end
  if n <= second * SHIFT then redis.call('ZREM', E_KEY, member) end
end

-- segment ``k``'s public members moved by ``delta`` (its :o entry goes with the last)
local function opens_add(k, delta)
  if delta == 0 then return end
  local base = tonumber(k) * OPEN_SHIFT
  local n = tonumber(redis.call('ZINCRBY', P_KEY, delta, k))
  if n == delta then n = tonumber(redis.call('ZINCRBY', P_KEY, base, k)) end
  if n <= base then redis.call('ZREM', P_KEY, k) end
end

-- members present: those recorded minus those whose stay ended (not yet swept)
local function present(now)
  local n = tonumber(redis.call('HGET', N_KEY, 'n')) or 0
  local ended = redis.call('ZRANGEBYSCORE', E_KEY, '-inf', int((now + 1) * SHIFT - 1), 'WITHSCORES')
  for i = 1, #ended, 2 do n = n - (tonumber(ended[i + 1]) - tonumber(ended[i]) * SHIFT) end
  if n < 0 then n = 0 end
  return n
end

-- the entry rewritten in place; ``old`` the end of its stay as it was recorded (0: a new
-- member), ``was_inv`` whether it was invisible, ``was_open`` whether it was public
local function room_store(uid, e, old, was_inv, was_open)
  local new = stay(e)
  redis.call('HSET', seg_key(e.k), uid, encode(e))
  if new ~= old then
    ends_add(old, -1)
    ends_add(new, 1)
  end
  -- the segment's due is never later than a stay in it: only an earlier end moves it
  if old == 0 or new < old then redis.call('ZADD', W_KEY, 'LT', new, e.k) end
  if e.i ~= was_inv then
    if e.i == 1 then redis.call('ZADD', I_KEY, 0, uid) else redis.call('ZREM', I_KEY, uid) end
  end
  if e.o ~= was_open then opens_add(e.k, e.o - was_open) end
end

-- a new member, at the tail of the join order
local function room_add(uid, e)
  local t = index_state().t
  local size = redis.call('HLEN', seg_key(int(t)))
  if size >= SEGMENT then
    t, size = t + 1, 0
    index.t = t
    redis.call('HSET', N_KEY, 't', t)
  end
  e.k = int(t)
  redis.call('HSET', idx_key(bucket(uid)), uid, e.k)
  if size == 0 then redis.call('ZADD', G_KEY, t, e.k) end
  room_store(uid, e, 0, 0, 0)
  maybe_split(redis.call('HINCRBY', N_KEY, 'n', 1))
  if index.kept then
    -- the room's first member since it emptied: z is the room's again
    redis.call('HSET', N_KEY, 'z', int(index.z))
    redis.call('DEL', Z_KEY)
    index.kept = false
  end
end

-- the room's last member gone: its keys deleted (not its outbox), z kept a while (:z)
local function room_emptied(z)
  redis.call('DEL', N_KEY, E_KEY, W_KEY, T_KEY, I_KEY, P_KEY)
  if z > 0 then redis.call('SET', Z_KEY, int(z), 'EX', ROOM_Z_KEEP) end
  index = nil
end

-- the member and its meta removed (``e`` as recorded); the room's last takes its keys along
local function room_remove(uid, e)
  redis.call('HDEL', seg_key(e.k), uid)
  redis.call('HDEL', idx_key(bucket(uid)), uid)
  redis.call('ZREM', I_KEY, uid)
  for _, c in ipairs(e.c) do
    if c.meta then redis.call('HDEL', T_KEY, uid .. '|' .. c.d) end
  end
  ends_add(stay(e), -1)
  if e.o == 1 then opens_add(e.k, -1) end
  if redis.call('EXISTS', seg_key(e.k)) == 0 then
    redis.call('ZREM', G_KEY, e.k)
    redis.call('ZREM', W_KEY, e.k)
  end
  -- the last segment gone: the room's last member (what n says too)
  if redis.call('HINCRBY', N_KEY, 'n', -1) <= 0 and redis.call('EXISTS', G_KEY) == 0 then
    room_emptied(index_state().z)
  end
end

-- the outbox entries this script made (room_entered / room_left), in order
local MADE = {}
-- ``uid`` entered the room (made 1) or left it (-1) at ``at`` (s): recorded in the room's
-- outbox in this script, so exactly one caller on the site is told (presence.outbox)
local function room_made(made, at, uid, now)
  MADE[#MADE + 1] = record(O_KEY, made, 0, int(at), uid, now)
end

-- the next time the room must be swept (false: the room is empty and its outbox too): a
-- member's stay may end, or an outbox entry is left to the sweep ``deadline`` s after it, one
-- this script made too (its caller claims it at once, but may never get to: the room stays due
-- while its outbox holds one)
local function room_next_due(deadline)
  local first = redis.call('ZRANGE', W_KEY, 0, 0, 'WITHSCORES')[2]
  local oldest = redis.call('ZRANGE', O_KEY, 0, 0, 'WITHSCORES')[2]
  if oldest then
    local due = tonumber(oldest) + deadline
    if not first or due < tonumber(first) then return int(due) end
  end
  return first or false
end

-- The room's sweep scheduled no later than ``due`` (s), where the caller gave the schedule as
-- KEYS[2] (one Redis: in this script, first, so no key is left without a due time; on a
-- cluster the schedule is in another slot, written by its own command just before)
local function schedule(due, room)
  if KEYS[2] then redis.call('ZADD', KEYS[2], 'LT', due, room) end
end
