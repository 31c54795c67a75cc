-- Seeds a shard's copy of the database's choices (presence.copies) once Redis lost it (a restart
-- without persistence, a flush; or it was never seeded) or may hold an old one (a restart that
-- loaded a snapshot, a replica promoted: its marker is of another run of the server, see
-- lua/ledger.lua's ``seeded``). KEYS the shard's ledger (online, hidden, invisible; see LEDGER),
-- its expiring schedule, and the invisible set's ``:seeded``, ``:touched`` and ``:seeding``;
-- ARGV[1] 1 for the seed's last part, ARGV[2] n, then n users who chose to be invisible, then
-- pairs (second, user) of custom statuses expiring: as the database held them, read before.
-- Each user is added to "invisible" unless written since the shard was lost (set_invisible.lua
-- marked them, with this run: their write came after the database was read, and stands), and
-- listed in ``:seeding``; each expiry is added unless one is set.
-- The last part takes out of "invisible" each user no part listed (nor another process's seeding
-- at once) and not written since (one the database no longer holds: made visible after the
-- snapshot), moves each user the ledger holds to the set their choice puts them in ("hidden"
-- held every user it could not tell meanwhile), empties ``:touched`` but for TOUCHED_KEPT (the
-- key kept: lua/ledger.lua), removes ``:seeding`` and marks the shard seeded by this run
-- (``:seeded``, beside "invisible": the ledger's scripts read the set as the database's from
-- then on). Returns 1, or 0 when the shard was seeded already (by another process: this part
-- is left out). (``:seeding``, and ``:touched`` while not seeded, are usually absent: a seed
-- asked while their slot migrates is redirected, fails and is retried: seeds are rare.)
local run = server_run()
local mark, touched, listed = KEYS[5], KEYS[6], KEYS[7]
if seeded(mark, run) then return 0 end
local n = tonumber(ARGV[2])
for i = 3, n + 2 do
  redis.call('SADD', listed, ARGV[i])
  if redis.call('SISMEMBER', touched, run .. ':' .. ARGV[i]) == 0 then
    redis.call('SADD', KEYS[3], ARGV[i])
  end
end
for i = n + 3, #ARGV - 1, 2 do
  redis.call('ZADD', KEYS[4], 'NX', ARGV[i], ARGV[i + 1])
end
if ARGV[1] ~= '1' then return 1 end
for _, uid in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if redis.call('SISMEMBER', listed, uid) == 0
      and redis.call('SISMEMBER', touched, run .. ':' .. uid) == 0 then
    redis.call('SREM', KEYS[3], uid)
  end
end
local held = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #held, 2 do
  if redis.call('SISMEMBER', KEYS[3], held[i]) == 0 then
    redis.call('ZREM', KEYS[2], held[i])
    redis.call('ZADD', KEYS[1], held[i + 1], held[i])
  end
end
for _, uid in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local at = redis.call('ZSCORE', KEYS[1], uid)
  if at then
    redis.call('ZREM', KEYS[1], uid)
    redis.call('ZADD', KEYS[2], at, uid)
  end
end
redis.call('DEL', touched, listed)
redis.call('SADD', touched, TOUCHED_KEPT)
redis.call('SET', mark, run)
return 1
