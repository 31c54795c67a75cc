-- KEYS the shard's ledger (online, hidden, invisible; see LEDGER), then the invisible set's
-- ``:seeded`` marker and ``:touched`` set (lua/seed_ledger.lua); ARGV member, 1 (invisible)
-- or 0. Records the user's choice for the ledger's count, moving them between "online" and
-- "hidden" if they are online (keeping the time they turn offline). Returns 1 when it changed.
-- On a shard not seeded yet by this run of the server (lua/ledger.lua's ``seeded``) the user is
-- marked as written here, with the run (a mark of a run before a restart is not this one's):
-- the seed, which read the database before this write, leaves their choice as this write made it.
-- On a seeded shard it keeps ``:touched`` (TOUCHED_KEPT, lua/ledger.lua), which a shard seeded
-- by an older version lacks: declared in KEYS, it must exist for a migrating slot to run it.
local run = server_run()
if not seeded(KEYS[4], run) then
  redis.call('SADD', KEYS[5], run .. ':' .. ARGV[1])
else
  redis.call('SADD', KEYS[5], TOUCHED_KEPT)
end
local from, to = KEYS[2], KEYS[1]
local changed
if ARGV[2] == '1' then
  changed = redis.call('SADD', KEYS[3], ARGV[1])
  from, to = KEYS[1], KEYS[2]
else
  changed = redis.call('SREM', KEYS[3], ARGV[1])
end
-- Moved even when the set held the choice already: a user the ledger took for invisible
-- while not seeded (lua/ledger.lua) is in "hidden" without being in the set.
local at = redis.call('ZSCORE', from, ARGV[1])
if at then
  redis.call('ZREM', from, ARGV[1])
  redis.call('ZADD', to, at, ARGV[1])
  return 1
end
return changed
