-- The shard's online ledger: the users made online and not yet made offline, in two sorted
-- sets by the time each turns offline if nothing else happens (domain.offline_at): "online" for
-- the visible, "hidden" for those in the shard's "invisible" set. A write's script settles the
-- user against it atomically, so exactly one caller on the whole site is told "this call made
-- the user online" (or offline): presence.signals' user_online / user_offline. ZCOUNT of
-- "online" from now on is the number online (api.online_count), right whether or not a sweep
-- has yet made the users past their time offline.
-- The time a score turns offline (false: none), ARGV timing: grace, ttl, window in seconds.
local function offline_time(score, grace, ttl, window)
  if not score then return false end
  local s = tonumber(score)
  local ts = math.floor(math.abs(s) / SCORE_FACTOR)
  if s < 0 then return ts + 1 + grace end
  if s % SCORE_FACTOR >= FLAG_CONNECTED then return ts + 1 + ttl end
  return ts + window
end
-- This run of the server: INFO's run_id, another after a restart (whatever it loaded: nothing,
-- or a snapshot older than its last writes) and on a replica promoted; '' where INFO is refused
-- (an ACL without @dangerous: then the marker alone tells a seeded shard, as a restart that
-- loaded an older snapshot cannot be told).
local function server_run()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then return '' end
  return string.match(info, 'run_id:(%x+)') or ''
end
-- Whether the shard's copy of the choices (its ``invisible`` set; lua/seed_ledger.lua) was
-- seeded from the database by this run of the server (``run``: server_run(), if known): ``mark``,
-- its ``:seeded`` marker, holds the run that seeded it. A marker of another run (a snapshot
-- loaded, a replica promoted) says nothing of the choices written since that snapshot: not
-- seeded. Every script declares the marker (and ``:touched``, ``:seeding``) in its KEYS, never
-- builds it: on a cluster, a slot migrating whose marker moved first is answered TRYAGAIN or
-- ASK before the script runs, not stopped half-way through its writes.
local function seeded(mark, run)
  return redis.call('GET', mark) == (run or server_run())
end
-- The one member of a seeded shard's ``:touched`` set, never a mark ("<run>:<user>"): on a
-- cluster a script is redirected while its slot migrates for as long as one of its KEYS does
-- not exist there, so ``:touched`` is kept (set_invisible.lua declares it), not deleted.
local TOUCHED_KEPT = '-'
-- Settles uid whose score is now ``score``: keys {online, hidden, invisible, outbox, the
-- ``:seeded`` marker}; ``old``
-- (optional) the score before the write (a write making the user online comes no earlier than
-- its end). Returns {made (1 online, -1 offline, 0 neither),
-- invisible (0/1; 2: guessed, the shard not seeded), at (when, as text), outbox entry}, then,
-- when this write also made the
-- offline before that online (the user was still in the ledger past their time), that
-- offline's at and outbox entry (the caller sends it first).
local function settle(keys, uid, score, now, grace, ttl, window, old)
  grace, ttl, window = tonumber(grace), tonumber(ttl), tonumber(window)
  local until_ = offline_time(score, grace, ttl, window)
  if until_ and now < until_ then
    local was = offline_time(old, grace, ttl, window)
    -- A heartbeat is mostly a visible user's, online already: moving their time in "online"
    -- says so (a user there is not invisible: SET_INVISIBLE moves them), one command, not two.
    if was and now < was and redis.call('ZADD', keys[1], 'XX', 'CH', until_, uid) == 1 then
      return {0, 0, false, false}
    end
    local invisible = redis.call('SISMEMBER', keys[3], uid)
    -- A shard whose invisible set Redis lost (a restart, a flush) and that is not seeded again
    -- from the database yet (lua/seed_ledger.lua): a user it does not hold as visible may have
    -- chosen to be invisible, so is taken for invisible (hidden, not counted) until the seed
    -- moves them. ``told`` 2 in the reply and the outbox entry: a guess (the signal reads the
    -- choice from the database; the caller has the shard seeded). (``seeded`` last: it reads
    -- INFO, only for a user coming online.)
    local told = invisible
    if invisible == 0 and not redis.call('ZSCORE', keys[1], uid) and not seeded(keys[5]) then
      invisible, told = 1, 2
    end
    local key = keys[1]
    if invisible == 1 then key = keys[2] end
    if old and tonumber(old) == tonumber(score) then
      -- The score as it was (a close or sign-off run late): the user is where the last write
      -- left them, offline already if a sweep elsewhere made them so meanwhile.
      redis.call('ZADD', key, 'XX', until_, uid)
      return {0, told, false, false}
    end
    -- (asked only when the user's last state had ended: a heartbeat's path is unchanged)
    local past = was and was <= now and redis.call('ZSCORE', key, uid)
    if past and tonumber(past) <= now then
      -- Still in the ledger past their time: nobody made them offline since (no sweep ran:
      -- a site without live processes). This write makes that offline, at its time, then the
      -- online, so the user's signals alternate (readers showed the user offline meanwhile).
      redis.call('ZADD', key, until_, uid)
      local off = record(keys[4], -1, told, past, uid, now)
      local at = tostring(now)
      return {1, told, at, record(keys[4], 1, told, at, uid, now), past, off}
    end
    if redis.call('ZADD', key, until_, uid) == 1 then
      -- A write whose time was taken before a sweep elsewhere made the user offline (a busy
      -- process) comes no earlier than that offline, whose moment is old's end: a user's
      -- signals keep their order.
      local at = tostring(math.max(now, was or now))
      return {1, told, at, record(keys[4], 1, told, at, uid, now)}
    end
    return {0, told, false, false}
  end
  for i = 1, 2 do
    local was = redis.call('ZSCORE', keys[i], uid)
    if was then
      redis.call('ZREM', keys[i], uid)
      return {-1, i - 1, was, record(keys[4], -1, i - 1, was, uid, now)}
    end
  end
  return {0, 0, false, false}
end
