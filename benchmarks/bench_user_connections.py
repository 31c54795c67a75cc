"""Redis time of one heartbeat by the number of the user's connections, before and after.

Before (presence <= 0.x): all of a user's connections lived in ONE hash field that the connection
script parsed and rewrote on every heartbeat, O(n) in the user's connections. Now each connection
is its own field, with per-user counts and a sorted set of expiries: O(log n). Both scripts run
side by side on the same Redis (the old one is kept here, verbatim, as the comparison).

For a user with 1, 100, 1,000 (and 3,000 in full mode) live connections: Redis-side microseconds
per heartbeat from INFO commandstats (``evalsha`` usec / calls) over a few hundred heartbeats of
the user's connections in turn; and Redis memory per connected user (one connection each, the
common case) from ``used_memory`` growth, old layout vs new.
"""

from __future__ import annotations

import time
from dataclasses import replace

from benchmarks.common import Report, Sizes, flush, raw_client, say
from presence.conf import get_settings
from presence.store import CONNECTION, PresenceStore, Script, script_call

NAME = "user_connections"
USER = 4242
MEMORY_FIRST_ID = 5_000_001

# The connection script before the per-connection layout (KEYS seen, conns; ARGV member, op,
# connection id, device bit, idle, now, start of the TTL, start of the online window).
OLD_CONNECTION = Script(
    """
local now = tonumber(ARGV[6])
local horizon = tonumber(ARGV[7])
local page_horizon = tonumber(ARGV[8])
local raw = redis.call('HGET', KEYS[2], ARGV[1])
local kept = {}
local pages = {}
local mask = 0
local all_idle = true
local latest = 0
local since = now
if raw then
  for entry in string.gmatch(raw, '[^,]+') do
    local id, b, idle, s, hb = string.match(entry, '^([^:]+):(%d+):(%d):(%d+):(%d+)$')
    if id == ARGV[3] then
      since = tonumber(s)
    elseif id and string.sub(id, 1, 1) == 'h' then
      -- a page view's device (see TOUCH): shown within the online window, never a connection
      if tonumber(hb) > page_horizon then
        pages[#pages + 1] = entry
        mask = bit.bor(mask, tonumber(b))
      end
    elseif id and tonumber(hb) > horizon then
      kept[#kept + 1] = entry
      mask = bit.bor(mask, tonumber(b))
      if idle == '0' then all_idle = false end
      if tonumber(hb) > latest then latest = tonumber(hb) end
    end
  end
end
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
local o = old and tonumber(old) or 0
local old_ts = math.floor(math.abs(o) / 32)
local old_flags = math.abs(o) % 32
if ARGV[2] == 'beat' and o > 0 and old_flags < 16 and old_ts > page_horizon then
  -- the first connection of a user seen by page views: their devices stay for the window
  for _, b in ipairs({1, 2, 4}) do
    if bit.band(old_flags, b) ~= 0 then
      pages[#pages + 1] = table.concat({'h' .. b, b, 1, old_ts, old_ts}, ':')
      mask = bit.bor(mask, b)
    end
  end
end
if ARGV[2] == 'beat' then
  kept[#kept + 1] = table.concat({ARGV[3], ARGV[4], ARGV[5], since, now}, ':')
  mask = bit.bor(mask, tonumber(ARGV[4]))
  if ARGV[5] == '0' then all_idle = false end
  latest = now
end
if #kept > 0 then
  for _, entry in ipairs(pages) do kept[#kept + 1] = entry end
  redis.call('HSET', KEYS[2], ARGV[1], table.concat(kept, ','))
  for _ = 1, #pages do kept[#kept] = nil end
elseif raw then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
local score = false
if #kept > 0 then
  local ts = latest
  if o > 0 and old_ts > ts then ts = old_ts end
  score = ts * 32 + 16 + mask
  if all_idle then score = score + 8 end
elseif o > 0 and old_flags >= 16 then
  local ts = old_ts
  if ARGV[2] == 'close' and now > ts then ts = now end
  score = -(ts * 32 + old_flags % 16)
end
if score and score ~= o then
  redis.call('ZADD', KEYS[1], score, ARGV[1])
else
  score = old or false
end
return {old or false, score and tostring(score) or false, #kept}
"""
)


def _store() -> PresenceStore:
    # No cap here: the point is what a user with many connections costs.
    return PresenceStore(replace(get_settings(), MAX_CONNECTIONS_PER_USER=10**6))


def _old_beat(store: PresenceStore, user_id: int, connection_id: str, now: int) -> tuple:
    bucket = store.keys.bucket_of(user_id)
    conf = store.conf
    return script_call(
        OLD_CONNECTION,
        [store.keys.seen_key(bucket), store.keys.conns_key(bucket)],
        [
            user_id,
            "beat",
            connection_id,
            1,
            0,
            now,
            now - conf.CONNECTION_TTL,
            now - conf.ONLINE_WINDOW,
        ],
    )


def _new_beat(store: PresenceStore, user_id: int, connection_id: str, now: int, op: str) -> tuple:
    return store.plans.connection(user_id, op, now, connection_id).commands[0]  # type: ignore[arg-type]


def _run(store: PresenceStore, commands: list[tuple]) -> None:
    for start in range(0, len(commands), 500):
        store._execute(commands[start : start + 500])


def _setup_old(store: PresenceStore, client, n: int, now: int) -> None:
    # Written directly (opening them through the old script one by one is O(n^2)).
    bucket = store.keys.bucket_of(USER)
    value = ",".join(f"c{i}:1:0:{now}:{now}" for i in range(n))
    client.hset(store.keys.conns_key(bucket), str(USER), value)
    client.zadd(store.keys.seen_key(bucket), {str(USER): now * 32 + 16 + 1})


def _per_beat_us(store: PresenceStore, client, commands: list[tuple]) -> float:
    client.config_resetstat()
    _run(store, commands)
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return int(stats["usec"]) / int(stats["calls"])


def _load(store: PresenceStore) -> None:
    for script in (OLD_CONNECTION, CONNECTION):
        store.client.script_load(script.source)


def run(sizes: Sizes, report: Report) -> None:
    quick = sizes.population < 1_000_000
    counts = [1, 100, 1000] if quick else [1, 100, 1000, 3000]
    beats = 100 if quick else 500
    say(f"\n== user_connections: heartbeat Redis time by connections of one user {counts} ==")
    client = raw_client(decode=True)
    store = _store()
    results: dict[tuple[str, int], float] = {}
    for n in counts:
        for layout in ("old", "new"):
            flush(client)
            _load(store)
            now = int(time.time())
            if layout == "old":
                _setup_old(store, client, n, now)
                commands = [_old_beat(store, USER, f"c{i % n}", now + 1) for i in range(beats)]
            else:
                _run(store, [_new_beat(store, USER, f"c{i}", now, "open") for i in range(n)])
                commands = [
                    _new_beat(store, USER, f"c{i % n}", now + 1, "beat") for i in range(beats)
                ]
            results[layout, n] = _per_beat_us(store, client, commands)
        say(
            f"  {n:>5,} connections: old {results['old', n]:8.1f} µs, "
            f"new {results['new', n]:6.1f} µs per heartbeat"
        )
    top = 1000
    for layout in ("old", "new"):
        report.add(
            NAME,
            f"{layout}: Redis µs per heartbeat at "
            + " / ".join(f"{n:,}" for n in counts)
            + " connections",
            " / ".join(f"{results[layout, n]:.1f}" for n in counts),
        )
    report.add(
        NAME, "old: time at 1,000 / time at 1", f"{results['old', top] / results['old', 1]:.1f}x"
    )
    report.add(
        NAME,
        "new: time at 1,000 / time at 1",
        f"{results['new', top] / results['new', 1]:.1f}x",
        goal="flat (<= 2x)",
        passed=results["new", top] / results["new", 1] <= 2,
    )
    report.add(
        NAME, "new vs old at 1,000 connections", f"{results['new', top] / results['old', top]:.3f}x"
    )
    if 3000 in counts:
        report.add(
            NAME,
            "new vs old at 3,000 connections",
            f"{results['new', 3000] / results['old', 3000]:.3f}x",
        )

    # Memory per connected user (one connection each), old layout vs new, with buckets as full
    # as a million online users make them with the default 16,384 buckets (~61 users each).
    users = 6_100 if quick else 61_000
    store = PresenceStore(replace(store.conf, BUCKETS=users // 61))
    memory: dict[str, float] = {}
    for layout in ("old", "new"):
        flush(client)
        _load(store)
        now = int(time.time())
        base = int(client.info("memory")["used_memory"])
        ids = range(MEMORY_FIRST_ID, MEMORY_FIRST_ID + users)
        if layout == "old":
            _run(store, [_old_beat(store, uid, "c0123456789abcde", now) for uid in ids])
        else:
            _run(store, [_new_beat(store, uid, "c0123456789abcde", now, "open") for uid in ids])
        memory[layout] = (int(client.info("memory")["used_memory"]) - base) / users
    say(
        f"  Redis memory per connected user (1 connection, {users:,} users): "
        f"old {memory['old']:.0f} B, new {memory['new']:.0f} B"
    )
    report.add(
        NAME,
        "Redis bytes per connected user (1 connection): old / new",
        f"{memory['old']:.0f} / {memory['new']:.0f}",
    )
    flush(client)
    client.close()
