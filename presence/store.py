"""The one Redis store: key scheme, scripts, sync and async faces, and the failure policy.

Layout (see README "Redis layout")::

    {KEY_PREFIX}:{<bucket>}:seen    sorted set, member = user id, score = encoded activity
    {KEY_PREFIX}:{<bucket>}:conns   hash, field = user id, value = the user's live connections
    {KEY_PREFIX}:{live}:due         sorted set, member = user id, score = when the user turns
                                    offline unless something happens (swept by live.py)
    {KEY_PREFIX}:{live}:expiring    sorted set, member = user id, score = when a custom status
                                    expires

Users are spread over ``BUCKETS`` small sorted sets (bucket = user id mod BUCKETS). The bucket
is the key's hash tag, so everything a script touches shares one Redis Cluster slot, and small
sets stay in Redis's compact listpack/ziplist encoding (about 16 bytes a user instead of ~100 in
one big skiplist). A score packs the last activity (whole seconds) and flags:
``seconds * 32 + device_mask + 8 * idle + 16 * connected``; a negative score means the user
signed off (logout, last connection closed) at that time, its flags describing the moment before.

Every command goes through :meth:`PresenceStore.run` / :meth:`PresenceStore.arun`, which batch a
plan into one pipeline (one round trip) and apply one failure policy: a Redis error is logged
once per outage, Redis is left alone for ``RETRY_INTERVAL`` seconds, and the plan's fallback is
returned (or :class:`StoreUnavailable` raised for plans that must not fail silently).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry

from presence import domain
from presence.conf import PresenceSettings, get_settings

logger = logging.getLogger("presence")

T = TypeVar("T")

#: score = seconds * SCORE_FACTOR + flags (device mask, FLAG_IDLE, FLAG_CONNECTED)
SCORE_FACTOR = 32


class StoreUnavailable(RuntimeError):
    """Redis could not be reached; raised only by operations that must not fail silently."""


class _Raise:
    pass


RAISE = _Raise()


@dataclass(frozen=True)
class Script:
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        import hashlib

        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# Score flags (low bits of a score, above the device mask):
FLAG_IDLE = 8
FLAG_CONNECTED = 16

# A connected user's aggregate (one hash field, field = user id, see CONNECTION):
# "connections:web:mobile:desktop:active:page_web:page_mobile:page_desktop" -- live connections,
# those of each device kind, the non-idle ones, and the time of the latest page view of each
# device kind while connected (0: none). Parsed and written in O(1) whatever the connections.
# Fields 2-4 (connections) and 6-8 (page views) of device bit b are 1 + slot(b), 5 + slot(b).
_AGGREGATE = """
local AGGREGATE = '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$'
local function slot(b) return math.floor(b / 2) + 1 end
"""

# KEYS[1] bucket's seen, KEYS[2] its connections; ARGV member, now, device bit, start of the
# online window, start of the connection TTL (activity at a start is already past it, as in
# domain.live_status: online while now < activity + window). Returns {old score or false, new
# score}. Never moves activity backwards; keeps the device kinds of the current online stretch
# and the "connected" flag of live connections; a request is input, so it clears "idle".
TOUCH = Script(
    _AGGREGATE
    + """
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
local now = tonumber(ARGV[2])
local mask = tonumber(ARGV[3])
local connected = 0
local ts = now
if old then
  local o = tonumber(old)
  if o > 0 then
    local old_ts = math.floor(o / 32)
    local flags = o % 32
    if old_ts > tonumber(ARGV[4]) then mask = bit.bor(flags % 8, mask) end
    if flags >= 16 and old_ts > tonumber(ARGV[5]) then connected = 16 end
    if old_ts > ts then ts = old_ts end
  end
end
if connected == 16 then
  -- Live connections recompute the devices on each heartbeat: the page view's device kind is
  -- kept in the user's aggregate beside them, a pseudo-connection that lasts the online window.
  local agg = redis.call('HGET', KEYS[2], ARGV[1])
  local a = agg and {string.match(agg, AGGREGATE)}
  if a and #a == 8 then
    a[5 + slot(tonumber(ARGV[3]))] = tostring(now)
    redis.call('HSET', KEYS[2], ARGV[1], table.concat(a, ':'))
  end
end
local score = ts * 32 + connected + mask
redis.call('ZADD', KEYS[1], score, ARGV[1])
return {old or false, tostring(score)}
"""
)

# KEYS[1] bucket; ARGV member, now, device bit, start of the connection TTL. The device signs
# off (logout); the last one signing off turns the score negative (signed off at that time,
# keeping the devices and idle flag shown during the grace). Live connections keep the user
# online. Returns {old score or false, new score}.
SIGN_OFF = Script(
    """
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
local now = tonumber(ARGV[2])
local bit_ = tonumber(ARGV[3])
local ts = now
local flags = 0
local mask = 0
local connected = false
if old then
  local o = tonumber(old)
  if o > 0 then
    local old_ts = math.floor(o / 32)
    flags = o % 32
    if old_ts > ts then ts = old_ts end
    connected = flags >= 16 and old_ts > tonumber(ARGV[4])
    mask = bit.band(flags % 8, bit.bnot(bit_))
  end
end
local score
if connected then
  score = ts * 32 + flags
elseif mask == 0 then
  score = -(ts * 32 + flags % 16)
else
  score = ts * 32 + mask
end
redis.call('ZADD', KEYS[1], score, ARGV[1])
return {old or false, tostring(score)}
"""
)

# Where a user's connections are, in the bucket's "expiries" sorted set: all scores 0, ordered
# by member "user:expiry:connection" (expiry = last heartbeat + TTL, ten digits), so one user's
# connections are a lexicographic range, those gone by ``now`` (expiry <= now, as in
# domain.live_status: online while now < heartbeat + TTL) a range below "user:<now + 1>".
_CONNECTIONS = """
local function expiry_member(prefix, expiry, id)
  return prefix .. string.format('%010d', expiry) .. ':' .. id
end
"""

# KEYS[1] bucket's seen, KEYS[2] bucket's connections (hash), KEYS[3] bucket's expiries;
# ARGV member, op ("open", "beat", "close" or "expire"), connection id, device bit, idle (0/1), now,
# start of the connection TTL, start of the online window (page views' devices, see TOUCH),
# most live connections a user may have.
# Each connection is one hash field "user:id" = "device_bit:idle:connected_at:expiry" and one
# member of the expiries set; the user's aggregate (field "user", see TOUCH) counts them, so a
# heartbeat costs O(log n) whatever the user's connections. Connections gone by now are dropped
# first (crash detection, at the moment domain.live_status counts them gone; a range query finds
# them); the seen score is recomputed from the aggregate: latest heartbeat, the devices, idle
# only if every connection is. When none is left the user signs off at their last activity (now
# for a close). An open (or a beat) of a connection that is not live while the user has the
# most live connections allowed is refused and changes nothing.
# Returns {old score or false, new score or false, live connections, refused (0/1)}.
CONNECTION = Script(
    _AGGREGATE
    + _CONNECTIONS
    + """
local uid = ARGV[1]
local op = ARGV[2]
local beat = op == 'beat' or op == 'open'
local id = ARGV[3]
local now = tonumber(ARGV[6])
local ttl = now - tonumber(ARGV[7])
local page_horizon = tonumber(ARGV[8])
local prefix = uid .. ':'
local field = prefix .. id
local first = '[' .. prefix
local gone_below = '(' .. prefix .. string.format('%010d', now + 1)
local old = redis.call('ZSCORE', KEYS[1], uid)
local o = old and tonumber(old) or 0
local old_ts = math.floor(math.abs(o) / 32)
local old_flags = math.abs(o) % 32
local raw = redis.call('HGET', KEYS[2], uid)
local a = raw and {string.match(raw, AGGREGATE)}
if not a or #a ~= 8 then a = {0, 0, 0, 0, 0, 0, 0, 0} end
for i = 1, 8 do a[i] = tonumber(a[i]) end
-- this connection's entry, unless it is gone already (a connection heard again after that
-- keeps its connected_at)
local cur = false
local since = now
if op ~= 'expire' then
  local value = redis.call('HGET', KEYS[2], field)
  if value then
    local b, idle, s, expiry = string.match(value, '^(%d+):(%d):(%d+):(%d+)$')
    if b then since = s end
    if b and tonumber(expiry) > now then cur = {tonumber(b), idle, s, tonumber(expiry)} end
  end
end
if beat and not cur and a[1] >= tonumber(ARGV[9]) then
  local live = a[1] - redis.call('ZLEXCOUNT', KEYS[3], first, gone_below)
  if live >= tonumber(ARGV[9]) then return {old or false, old or false, live, 1} end
end
-- crash detection: drop the connections not heard from for the TTL
local gone = redis.call('ZRANGEBYLEX', KEYS[3], first, gone_below)
for _, member in ipairs(gone) do
  local f = prefix .. string.sub(member, #prefix + 12)
  local value = redis.call('HGET', KEYS[2], f)
  if value then
    local b, idle = string.match(value, '^(%d+):(%d)')
    b = tonumber(b)
    a[1] = math.max(a[1] - 1, 0)
    a[1 + slot(b)] = math.max(a[1 + slot(b)] - 1, 0)
    if idle == '0' then a[5] = math.max(a[5] - 1, 0) end
    redis.call('HDEL', KEYS[2], f)
  end
end
if #gone > 0 then redis.call('ZREMRANGEBYLEX', KEYS[3], first, gone_below) end
if cur and op ~= 'expire' then
  -- taken out; a beat puts it back with its new state
  a[1] = a[1] - 1
  a[1 + slot(cur[1])] = a[1 + slot(cur[1])] - 1
  if cur[2] == '0' then a[5] = a[5] - 1 end
end
if beat then
  local b = tonumber(ARGV[4])
  local expiry = now + ttl
  if cur and cur[4] ~= expiry then
    redis.call('ZREM', KEYS[3], expiry_member(prefix, cur[4], id))
  end
  if o > 0 and old_flags < 16 and old_ts > page_horizon then
    -- the first connection of a user seen by page views: their devices stay for the window
    for _, pb in ipairs({1, 2, 4}) do
      if bit.band(old_flags, pb) ~= 0 then a[5 + slot(pb)] = math.max(a[5 + slot(pb)], old_ts) end
    end
  end
  a[1] = a[1] + 1
  a[1 + slot(b)] = a[1 + slot(b)] + 1
  if ARGV[5] == '0' then a[5] = a[5] + 1 end
  redis.call('ZADD', KEYS[3], 0, expiry_member(prefix, expiry, id))
  redis.call('HSET', KEYS[2], field, table.concat({b, ARGV[5], since, expiry}, ':'))
elseif op == 'close' and cur then
  redis.call('ZREM', KEYS[3], expiry_member(prefix, cur[4], id))
  redis.call('HDEL', KEYS[2], field)
end
local mask = 0
for _, pb in ipairs({1, 2, 4}) do
  if a[5 + slot(pb)] <= page_horizon then a[5 + slot(pb)] = 0 end
  if a[1 + slot(pb)] > 0 or a[5 + slot(pb)] > 0 then mask = bit.bor(mask, pb) end
end
if a[1] > 0 then
  local value = table.concat(a, ':')
  if value ~= raw then redis.call('HSET', KEYS[2], uid, value) end
elseif raw then
  -- no connection left: page views' devices go with them (the score keeps the last ones)
  redis.call('HDEL', KEYS[2], uid)
end
local score = false
if a[1] > 0 then
  local ts = now
  if not beat then
    if o > 0 then
      ts = old_ts
    else
      local latest = redis.call('ZREVRANGEBYLEX', KEYS[3], '(' .. uid .. ';', first, 'LIMIT', 0, 1)
      if latest[1] then ts = tonumber(string.sub(latest[1], #prefix + 1, #prefix + 10)) - ttl end
    end
  end
  if o > 0 and old_ts > ts then ts = old_ts end
  score = ts * 32 + 16 + mask
  if a[5] == 0 then score = score + 8 end
elseif o > 0 and old_flags >= 16 then
  local ts = old_ts
  if op == 'close' and now > ts then ts = now end
  score = -(ts * 32 + old_flags % 16)
end
if score and score ~= o then
  redis.call('ZADD', KEYS[1], score, uid)
else
  score = old or false
end
return {old or false, score and tostring(score) or false, a[1], 0}
"""
)

# KEYS[1] bucket's seen, KEYS[2] bucket's connections, KEYS[3] bucket's expiries; ARGV member1,
# score1, member2, score2... Removes each member whose score is still the one read (so a user
# active again since is kept), with everything left of its connections. Returns how many were
# removed.
REMOVE_IF_UNCHANGED = Script(
    """
local removed = 0
for i = 1, #ARGV, 2 do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) == tonumber(ARGV[i + 1]) then
    local prefix = ARGV[i] .. ':'
    local first, last = '[' .. prefix, '(' .. ARGV[i] .. ';'
    for _, member in ipairs(redis.call('ZRANGEBYLEX', KEYS[3], first, last)) do
      redis.call('HDEL', KEYS[2], prefix .. string.sub(member, #prefix + 12))
    end
    redis.call('ZREMRANGEBYLEX', KEYS[3], first, last)
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    removed = removed + 1
  end
end
return removed
"""
)

# KEYS[1] bucket's connections, KEYS[2] bucket's expiries; ARGV member, TTL. A user's live and
# not yet dropped connections as "id:device_bit:idle:connected_at:heartbeat", and page views'
# devices as "h<bit>:bit:1:at:at" (for inspection: tests, debugging).
DESCRIBE_CONNECTIONS = Script(
    _AGGREGATE
    + """
local prefix = ARGV[1] .. ':'
local entries = {}
local members = redis.call('ZRANGEBYLEX', KEYS[2], '[' .. prefix, '(' .. ARGV[1] .. ';')
for _, member in ipairs(members) do
  local id = string.sub(member, #prefix + 12)
  local value = redis.call('HGET', KEYS[1], prefix .. id)
  if value then
    local b, idle, since, expiry = string.match(value, '^(%d+):(%d):(%d+):(%d+)$')
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
"""
)

# KEYS[1] a schedule (sorted set of user ids by due time); ARGV now, limit. Takes the due
# members out and returns them, so two sweepers never handle the same one.
CLAIM_DUE = Script(
    """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
"""
)


@dataclass
class Plan(Generic[T]):
    """Commands sent together in one pipeline, and how to read their replies."""

    commands: list[tuple[Any, ...]]
    parse: Callable[[list[Any]], T]
    #: returned when Redis is unavailable; RAISE to raise StoreUnavailable instead
    fallback: T | _Raise


def merge(plans: Sequence[Plan[T]]) -> Plan[list[T]]:
    """Several plans as one (one round trip); falls back to each plan's fallback, or raises
    if any plan must not fail silently."""
    bounds: list[tuple[int, int]] = []
    commands: list[tuple[Any, ...]] = []
    for plan in plans:
        bounds.append((len(commands), len(commands) + len(plan.commands)))
        commands += plan.commands

    def parse(replies: list[Any]) -> list[T]:
        return [plan.parse(replies[a:b]) for plan, (a, b) in zip(plans, bounds, strict=True)]

    fallback: list[T] | _Raise = RAISE
    if not any(isinstance(plan.fallback, _Raise) for plan in plans):
        fallback = [plan.fallback for plan in plans]  # type: ignore[misc]
    return Plan(commands=commands, parse=parse, fallback=fallback)


def script_call(script: Script, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    return ("SCRIPT", script, tuple(keys), tuple(args))


def decode_score(score: float | str | None) -> domain.LiveState:
    if score is None:
        return domain.LiveState()
    value = int(float(score))
    signed_off = value < 0
    seconds, flags = divmod(abs(value), SCORE_FACTOR)
    return domain.LiveState(
        last_active=float(seconds),
        devices=domain.devices_from_mask(flags % domain.DEVICE_MASK_LIMIT),
        signed_off=signed_off,
        connected=not signed_off and bool(flags & FLAG_CONNECTED),
        idle=bool(flags & FLAG_IDLE),
    )


def _pairs(reply: list[Any]) -> list[tuple[Any, Any]]:
    """(member, score) pairs of a WITHSCORES reply, flat (RESP2 raw) or paired (parsed)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(member, score) for member, score in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


@dataclass(frozen=True)
class StaleEntry:
    user_id: int
    bucket: int
    score: str

    @property
    def state(self) -> domain.LiveState:
        return decode_score(self.score)

    @property
    def seen_at(self) -> float:
        last_active = self.state.last_active
        assert last_active is not None
        return last_active


ConnectionOp = Literal["open", "beat", "close", "expire"]


@dataclass(frozen=True)
class Transition:
    """A user's live state before and after a write."""

    user_id: int
    before: domain.LiveState
    after: domain.LiveState
    #: live connections left (connection writes only)
    connections: int | None = None
    #: a new connection past MAX_CONNECTIONS_PER_USER: nothing was recorded
    refused: bool = False

    @classmethod
    def from_reply(cls, user_id: int, reply: list[Any]) -> Transition:
        return cls(
            user_id,
            decode_score(reply[0]),
            decode_score(reply[1]),
            int(reply[2]) if len(reply) > 2 else None,
            bool(int(reply[3])) if len(reply) > 3 else False,
        )


class _Health:
    """Tracks an outage so it is logged once and Redis is not hammered while down."""

    def __init__(self) -> None:
        self.down_until = 0.0
        self.in_outage = False
        self._lock = threading.Lock()

    def available(self) -> bool:
        return time.time() >= self.down_until

    def failed(self, error: Exception, retry_interval: float) -> None:
        with self._lock:
            self.down_until = time.time() + retry_interval
            if not self.in_outage:
                self.in_outage = True
                logger.warning(
                    "Presence: Redis is unavailable (%s). Pages keep working; presence is not "
                    "recorded until Redis answers again (retrying every %ss).",
                    error,
                    retry_interval,
                )

    def succeeded(self) -> None:
        if self.in_outage:
            with self._lock:
                if self.in_outage:
                    self.in_outage = False
                    self.down_until = 0.0
                    logger.warning("Presence: Redis is reachable again; recording resumed.")


REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})


def redis_location(cache_conf: dict[str, Any]) -> str | None:
    """The URL presence connects to: a django-redis cache's first (primary) location, or None
    when it is not a redis://, rediss:// or unix:// URL."""
    location = cache_conf.get("LOCATION")
    if isinstance(location, list | tuple):
        location = location[0] if location else None
    if isinstance(location, str):
        location = location.split(",")[0]
    if not isinstance(location, str) or urlsplit(location).scheme not in REDIS_SCHEMES:
        return None
    return location


class PresenceStore:
    def __init__(self, conf: PresenceSettings) -> None:
        self.conf = conf
        self.health = _Health()
        #: users this process claimed from the due schedule but could neither check nor put
        #: back (Redis failed in between): its next sweep checks them, so an outage loses nobody
        self.unswept: set[int] = set()
        self._client: redis.Redis | None = None
        self._async_clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, redis.asyncio.Redis
        ] = weakref.WeakKeyDictionary()

    # --- key scheme -------------------------------------------------------------------------

    def bucket_of(self, user_id: int) -> int:
        return user_id % self.conf.BUCKETS

    def seen_key(self, bucket: int) -> str:
        return f"{self.conf.KEY_PREFIX}:{{{bucket}}}:seen"

    def conns_key(self, bucket: int) -> str:
        return f"{self.conf.KEY_PREFIX}:{{{bucket}}}:conns"

    def expiries_key(self, bucket: int) -> str:
        return f"{self.conf.KEY_PREFIX}:{{{bucket}}}:expiries"

    @property
    def due_key(self) -> str:
        return f"{self.conf.KEY_PREFIX}:{{live}}:due"

    @property
    def expiring_key(self) -> str:
        return f"{self.conf.KEY_PREFIX}:{{live}}:expiring"

    def by_bucket(self, user_ids: Iterable[int]) -> dict[int, list[int]]:
        grouped: dict[int, list[int]] = defaultdict(list)
        for user_id in user_ids:
            grouped[self.bucket_of(user_id)].append(user_id)
        return grouped

    # --- clients ----------------------------------------------------------------------------

    def _connection_kwargs(self) -> tuple[str, dict[str, Any]]:
        caches = getattr(django_settings, "CACHES", {})
        try:
            cache_conf = caches[self.conf.CACHE_ALIAS]
        except KeyError:
            raise ImproperlyConfigured(
                f"PRESENCE['CACHE_ALIAS'] is {self.conf.CACHE_ALIAS!r}, which is not in CACHES "
                "(see presence.E004)."
            ) from None
        location = redis_location(cache_conf)
        if location is None:
            raise ImproperlyConfigured(
                f"CACHES[{self.conf.CACHE_ALIAS!r}]['LOCATION'] must be a redis:// URL."
            )
        options = cache_conf.get("OPTIONS", {})
        kwargs: dict[str, Any] = dict(options.get("CONNECTION_POOL_KWARGS", {}))
        if options.get("PASSWORD"):
            kwargs["password"] = options["PASSWORD"]
        kwargs["socket_timeout"] = options.get("SOCKET_TIMEOUT") or self.conf.SOCKET_TIMEOUT
        kwargs["socket_connect_timeout"] = (
            options.get("SOCKET_CONNECT_TIMEOUT") or self.conf.SOCKET_TIMEOUT
        )
        kwargs["decode_responses"] = True
        return location, kwargs

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            location, kwargs = self._connection_kwargs()
            # Our own failure policy replaces redis-py's retries: a down Redis must cost a
            # page one short timeout, not several.
            kwargs["retry"] = Retry(NoBackoff(), 0)
            self._client = redis.Redis.from_url(location, **kwargs)
        return self._client

    @property
    def async_client(self) -> redis.asyncio.Redis:
        # redis.asyncio connections belong to one event loop.
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            from redis.asyncio.retry import Retry as AsyncRetry

            location, kwargs = self._connection_kwargs()
            kwargs["retry"] = AsyncRetry(NoBackoff(), 0)
            # Many connections of one process write at once: past the pool's size, wait for a
            # connection instead of failing ("Too many connections" would look like an outage).
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                location,
                max_connections=kwargs.pop("max_connections", 100),
                timeout=max(5.0, self.conf.SOCKET_TIMEOUT * 10),
                **kwargs,
            )
            client = redis.asyncio.Redis(connection_pool=pool)
            self._async_clients[loop] = client
        return client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        client = self._async_clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    # --- executing plans --------------------------------------------------------------------

    @staticmethod
    def _queue(pipe: Any, commands: Sequence[tuple[Any, ...]]) -> None:
        for command in commands:
            if command[0] == "SCRIPT":
                _, script, keys, args = command
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            else:
                pipe.execute_command(*command)

    @staticmethod
    def _without_script(replies: list[Any]) -> list[int]:
        """Positions of the commands Redis refused for not knowing their script."""
        return [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]

    @staticmethod
    def _raise_first_error(replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    def _failed(self, plan: Plan[T], error: Exception) -> T:
        self.health.failed(error, self.conf.RETRY_INTERVAL)
        return self._fallback(plan, error)

    @staticmethod
    def _fallback(plan: Plan[T], error: Exception | None = None) -> T:
        if isinstance(plan.fallback, _Raise):
            raise StoreUnavailable(
                f"Redis is unavailable: {error or 'in an outage, retrying shortly'}"
            ) from error
        return plan.fallback

    # When Redis has lost its scripts (restart, SCRIPT FLUSH, or another client loading them
    # half-way through our pipeline), the other commands of the pipeline have run already: only
    # the refused ones are sent again, after loading their scripts, so no command runs twice.

    def _execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        with self.client.pipeline(transaction=False) as pipe:
            self._queue(pipe, commands)
            return list(pipe.execute(raise_on_error=False))

    async def _aexecute(
        self, client: redis.asyncio.Redis, commands: Sequence[tuple[Any, ...]]
    ) -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            self._queue(pipe, commands)
            return list(await pipe.execute(raise_on_error=False))

    def run(self, plan: Plan[T]) -> T:
        if not plan.commands:
            return plan.parse([])
        if not self.health.available():
            return self._fallback(plan)
        try:
            replies = self._execute(plan.commands)
            missing = self._without_script(replies)
            if missing:
                for script in {plan.commands[i][1] for i in missing}:
                    self.client.script_load(script.source)
                retried = self._execute([plan.commands[i] for i in missing])
                for i, reply in zip(missing, retried, strict=True):
                    replies[i] = reply
            self._raise_first_error(replies)
        except RedisError as error:
            return self._failed(plan, error)
        self.health.succeeded()
        return plan.parse(replies)

    async def arun(self, plan: Plan[T]) -> T:
        if not plan.commands:
            return plan.parse([])
        if not self.health.available():
            return self._fallback(plan)
        try:
            client = self.async_client
            replies = await self._aexecute(client, plan.commands)
            missing = self._without_script(replies)
            if missing:
                for script in {plan.commands[i][1] for i in missing}:
                    await client.script_load(script.source)
                retried = await self._aexecute(client, [plan.commands[i] for i in missing])
                for i, reply in zip(missing, retried, strict=True):
                    replies[i] = reply
            self._raise_first_error(replies)
        except (RedisError, OSError) as error:
            return self._failed(plan, error)
        self.health.succeeded()
        return plan.parse(replies)

    # --- plans ------------------------------------------------------------------------------

    def touch(self, user_id: int, device: domain.Device, now: float) -> Plan[Transition | None]:
        """Record a request. The user is due to turn offline ONLINE_WINDOW later at the latest
        (``LT``: an earlier due time, such as a connection's, is kept)."""
        seconds = int(now)
        return Plan(
            commands=[
                script_call(
                    TOUCH,
                    [
                        self.seen_key(self.bucket_of(user_id)),
                        self.conns_key(self.bucket_of(user_id)),
                    ],
                    [
                        user_id,
                        seconds,
                        domain.DEVICE_BITS[device],
                        seconds - self.conf.ONLINE_WINDOW,
                        seconds - self.conf.CONNECTION_TTL,
                    ],
                ),
                ("ZADD", self.due_key, "LT", seconds + self.conf.ONLINE_WINDOW, user_id),
            ],
            parse=lambda replies: Transition.from_reply(user_id, replies[0]),
            fallback=None,
        )

    def sign_off(self, user_id: int, device: domain.Device, now: float) -> Plan[Transition | None]:
        seconds = int(now)
        return Plan(
            commands=[
                script_call(
                    SIGN_OFF,
                    [self.seen_key(self.bucket_of(user_id))],
                    [
                        user_id,
                        seconds,
                        domain.DEVICE_BITS[device],
                        seconds - self.conf.CONNECTION_TTL,
                    ],
                ),
                ("ZADD", self.due_key, seconds + self.conf.OFFLINE_GRACE, user_id),
            ],
            parse=lambda replies: Transition.from_reply(user_id, replies[0]),
            fallback=None,
        )

    def connection(
        self,
        user_id: int,
        op: ConnectionOp,
        now: float,
        connection_id: str = "-",
        device: domain.Device = domain.Device.WEB,
        idle: bool = False,
    ) -> Plan[Transition | None]:
        """A connection's opening ("open"), heartbeat ("beat"), close, or ("expire") a check
        that drops the user's connections not heard from for CONNECTION_TTL.

        An open (or a beat of a connection no longer live) while the user has
        MAX_CONNECTIONS_PER_USER live connections is refused (``Transition.refused``) and
        records nothing. One round trip: the script, then the user's due time (a heartbeat's
        TTL, or the grace after the last connection closed); an open sets its due time only
        once accepted (:meth:`connected`), so a refused one leaves no trace at all.
        """
        bucket = self.bucket_of(user_id)
        seconds = int(now)
        commands: list[tuple[Any, ...]] = [
            script_call(
                CONNECTION,
                [self.seen_key(bucket), self.conns_key(bucket), self.expiries_key(bucket)],
                [
                    user_id,
                    op,
                    connection_id,
                    domain.DEVICE_BITS[device],
                    int(idle),
                    seconds,
                    seconds - self.conf.CONNECTION_TTL,
                    seconds - self.conf.ONLINE_WINDOW,
                    self.conf.MAX_CONNECTIONS_PER_USER,
                ],
            )
        ]
        if op == "beat":
            commands.append(self._connected_due(user_id, seconds))
        elif op == "close":
            commands.append(("ZADD", self.due_key, seconds + self.conf.OFFLINE_GRACE, user_id))
        return Plan(
            commands=commands,
            parse=lambda replies: Transition.from_reply(user_id, replies[0]),
            fallback=None,
        )

    def _connected_due(self, user_id: int, seconds: int) -> tuple[Any, ...]:
        return ("ZADD", self.due_key, seconds + self.conf.CONNECTION_TTL, user_id)

    def connected(self, user_id: int, now: float) -> Plan[bool]:
        """The due time of a user whose connection was just opened (heartbeat + TTL)."""
        return Plan(
            commands=[self._connected_due(user_id, int(now))],
            parse=lambda replies: True,
            fallback=False,
        )

    def describe_connections(self, user_id: int) -> Plan[list[str]]:
        """The user's connections as "id:device_bit:idle:connected_at:heartbeat" and the devices
        of their page views while connected as "h<bit>:bit:1:at:at" (inspection and tests)."""
        bucket = self.bucket_of(user_id)
        return Plan(
            commands=[
                script_call(
                    DESCRIBE_CONNECTIONS,
                    [self.conns_key(bucket), self.expiries_key(bucket)],
                    [user_id, self.conf.CONNECTION_TTL],
                )
            ],
            parse=lambda replies: [str(entry) for entry in replies[0]],
            fallback=RAISE,
        )

    def claim_due(self, now: float, limit: int) -> Plan[tuple[list[int], list[int]]]:
        """Users due to turn offline and users whose custom status expired, taken out of their
        schedules (each handed to one sweeper only)."""
        return Plan(
            commands=[
                script_call(CLAIM_DUE, [self.due_key], [int(now), limit]),
                script_call(CLAIM_DUE, [self.expiring_key], [int(now), limit]),
            ],
            parse=lambda replies: ([int(m) for m in replies[0]], [int(m) for m in replies[1]]),
            fallback=([], []),
        )

    def schedule(self, due: dict[int, float]) -> Plan[bool]:
        """Check these users again at these times (an earlier time already set is kept)."""
        args: list[Any] = []
        for user_id, at in due.items():
            args += [int(at) + 1, user_id]
        return Plan(
            commands=[("ZADD", self.due_key, "LT", *args)] if args else [],
            parse=lambda replies: True,
            fallback=False,
        )

    def schedule_expiry(self, user_id: int, at: float | None) -> Plan[bool]:
        """Announce the user's custom status clearing at ``at`` (None: it never expires)."""
        command: tuple[Any, ...] = (
            ("ZADD", self.expiring_key, int(at) + 1, user_id)
            if at is not None
            else ("ZREM", self.expiring_key, user_id)
        )
        return Plan(commands=[command], parse=lambda replies: True, fallback=False)

    def prune_schedules(self, before: float) -> Plan[int]:
        """Forget due times long past (sites without a live process never sweep them)."""
        return Plan(
            commands=[
                ("ZREMRANGEBYSCORE", self.due_key, "-inf", f"({int(before)}"),
                ("ZREMRANGEBYSCORE", self.expiring_key, "-inf", f"({int(before)}"),
            ],
            parse=lambda replies: int(replies[0]) + int(replies[1]),
            fallback=RAISE,
        )

    def read(self, user_ids: Iterable[int]) -> Plan[dict[int, domain.LiveState] | None]:
        """Live state of many users in one round trip (one ZMSCORE per bucket).

        Falls back to None (unknown) when Redis is unavailable, so callers can tell
        "not online" from "cannot tell".
        """
        grouped = self.by_bucket(set(user_ids))
        buckets = list(grouped.items())

        def parse(replies: list[Any]) -> dict[int, domain.LiveState] | None:
            states: dict[int, domain.LiveState] = {}
            for (_, members), scores in zip(buckets, replies, strict=True):
                for user_id, score in zip(members, scores, strict=True):
                    if score is not None:
                        states[user_id] = decode_score(score)
            return states

        return Plan(
            commands=[("ZMSCORE", self.seen_key(bucket), *members) for bucket, members in buckets],
            parse=parse,
            fallback=None,
        )

    def scan_stale(self, buckets: Sequence[int], before: float) -> Plan[list[StaleEntry]]:
        """Entries last active before ``before`` (and every signed-off one) in these buckets."""
        threshold = int(before) * SCORE_FACTOR

        def parse(replies: list[Any]) -> list[StaleEntry]:
            entries: list[StaleEntry] = []
            for bucket, reply in zip(buckets, replies, strict=True):
                for member, score in _pairs(reply):
                    entries.append(StaleEntry(int(member), bucket, str(int(float(score)))))
            return entries

        return Plan(
            commands=[
                # "(" makes the bound exclusive.
                ("ZRANGEBYSCORE", self.seen_key(bucket), "-inf", f"({threshold}", "WITHSCORES")
                for bucket in buckets
            ],
            parse=parse,
            fallback=RAISE,
        )

    def remove_unchanged(self, entries: Iterable[StaleEntry]) -> Plan[int]:
        grouped: dict[int, list[Any]] = defaultdict(list)
        for entry in entries:
            grouped[entry.bucket] += [entry.user_id, entry.score]
        return Plan(
            commands=[
                script_call(
                    REMOVE_IF_UNCHANGED,
                    [self.seen_key(bucket), self.conns_key(bucket), self.expiries_key(bucket)],
                    args,
                )
                for bucket, args in grouped.items()
            ],
            parse=lambda replies: sum(int(r) for r in replies),
            fallback=RAISE,
        )


_store: PresenceStore | None = None
_store_lock = threading.Lock()


def get_store() -> PresenceStore:
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                _store = PresenceStore(get_settings())
    return _store


def reset_clients() -> None:
    """Forget clients and cached settings (called when PRESENCE or CACHES change)."""
    global _store
    with _store_lock:
        if _store is not None:
            _store.close()
        _store = None


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: object) -> None:
    # The store is built from PRESENCE and CACHES (override_settings in tests).
    if setting in {"PRESENCE", "CACHES"}:
        reset_clients()
