"""The channel layer as presence's announcements reach it (the messages are
:mod:`presence.announce`'s):

- :func:`layer_slot`: an event loop's limit on channel-layer calls in flight;
- the groups' names: a user's watchers, a user's sockets (``account``), a topic kind, a room,
  every process with rooms;
- :func:`with_members`: which groups have members, asked for by one moment's announcements
  together;
- :func:`group_calls_of`: joins and leaves of several groups in one round trip;
- where sync code's announcements are sent from: made in a database call of an event loop's
  operation (:func:`sent_from_this_loop`, presence.operations), they are held and sent from
  that loop once the call returns, so the database's thread never waits on the channel layer;
  made anywhere else (a view, the admin, a signal receiver), on the one announcer loop of the
  process, the caller waiting until they are sent (:func:`run_from_sync`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

from presence.conf import get_settings
from presence.domain import UserId
from presence.gathering import Gathering
from presence.users import group_key

logger = logging.getLogger("presence")

#: channel-layer calls in flight at once on one event loop, all callers together: channels_redis
#: draws each call's connection from a pool that raises "Too many connections" past 100
#: (redis-py's default), which would lose the call; past this many, a call waits its turn
LAYER_CALLS_AT_ONCE = 64

_layer_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def layer_slot() -> asyncio.Semaphore:
    """The running event loop's limit on channel-layer calls in flight (``async with``)."""
    loop = asyncio.get_running_loop()
    slots = _layer_slots.get(loop)
    if slots is None:
        slots = _layer_slots[loop] = asyncio.Semaphore(LAYER_CALLS_AT_ONCE)
    return slots


# --- which layer -------------------------------------------------------------------------------

#: channels_redis's two layers, by :func:`layer_kind`
CORE_LAYER = "channels_redis.core.RedisChannelLayer"
PUBSUB_LAYER = "channels_redis.pubsub.RedisPubSubChannelLayer"


def layer_kind(layer: Any) -> str:
    """The layer's class by its dotted name: what relies on how a layer sends, orders or
    receives matches the class itself, not a subclass that may change it."""
    kind = type(layer)
    return f"{kind.__module__}.{kind.__qualname__}"


# --- group names --------------------------------------------------------------------------------


def _group_prefix() -> str:
    return _safe_prefix(get_settings().KEY_PREFIX)


@functools.lru_cache(maxsize=8)
def _safe_prefix(key_prefix: str) -> str:
    # Channel-layer group names allow only these characters. Memoized: every watch, unwatch
    # and announcement names groups, and a regex substitution each was 2 % of a page view.
    return re.sub(r"[^a-zA-Z0-9\-_.]", "-", key_prefix)[:40]


#: the settings the group names below were made under, and each user's group name: a page
#: view's socket names the groups of its 50 users when it watches them and again when it closes
_named: tuple[object, dict[UserId, str]] = (None, {})
#: user group names kept at most (a miss costs one f-string)
_NAMES_KEPT = 65536


def group_name(user_id: UserId) -> str:
    global _named
    conf = get_settings()  # the same object until PRESENCE changes (KEY_PREFIX with it)
    made_under, names = _named
    if made_under is not conf or len(names) >= _NAMES_KEPT:
        names = {}
        _named = (conf, names)
    name = names.get(user_id)
    if name is None:
        name = names[user_id] = f"{_safe_prefix(conf.KEY_PREFIX)}.user.{group_key(user_id)}"
    return name


def account_group_name(user_id: UserId) -> str:
    """The group of the processes holding sockets of this user opened with a session or a
    token (they close when it ends)."""
    return f"{_group_prefix()}.account.{group_key(user_id)}"


def topic_group_name(kind: str) -> str:
    return f"{_group_prefix()}.topic.{kind}"


def room_group_name(room: str) -> str:
    """The group of the processes with connections in ``room`` (a digest: a room's id may hold
    any printable character, a group name only ``[a-zA-Z0-9-_.]``)."""
    digest = hashlib.sha1(room.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{_group_prefix()}.room.{digest}"


def probe_group_name(channel: str) -> str:
    """The group of one hub's channel alone, that its probes go through (presence.hub.Hub.probe):
    a group's messages reach a channel in order with the other groups' (channels_redis sends to
    a process's channel by another route than to its groups when the layer has several
    servers)."""
    digest = hashlib.sha1(channel.encode()).hexdigest()[:24]
    return f"{_group_prefix()}.probe.{digest}"


def rooms_group_name() -> str:
    """The group of every process with connections in rooms."""
    return f"{_group_prefix()}.rooms"


# --- which groups have members ----------------------------------------------------------------


class _GroupSizes(Gathering[list[str], set[str]]):
    """Which groups of channels_redis's core layer have members, asked for by the
    announcements of one event loop's moment together: one pipeline of ZCARDs per layer server.

    channels_redis's group_send costs two round trips before it finds a group empty (expire the
    stale members, read the rest), and most announced users are watched nowhere at that moment
    (a page view's socket announces its user coming online; the sweep, the same user offline
    after the grace): on a site of pages those empty sends were most of a page view's Redis
    round trips. A group with members (stale ones included) gets the layer's own group_send.
    Whatever fails (channels_redis's internals included) answers every waiting announcement
    with the error, and they then send as before."""

    def __init__(self, layer: Any) -> None:
        super().__init__(self._occupied)
        self.layer = layer

    async def _occupied(self, asked: list[list[str]]) -> list[set[str]]:
        layer = self.layer
        by_server: dict[int, list[str]] = {}
        for groups in asked:
            for group in groups:
                by_server.setdefault(layer.consistent_hash(group), []).append(group)
        occupied: set[str] = set()
        for index, groups in by_server.items():
            async with layer_slot(), layer.connection(index).pipeline(False) as pipe:
                for group in groups:
                    pipe.zcard(layer._group_key(group))
                sizes = await pipe.execute()
            occupied.update(g for g, size in zip(groups, sizes, strict=True) if size)
        return [occupied] * len(asked)


_group_sizes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _GroupSizes] = (
    weakref.WeakKeyDictionary()
)


def _counts_members(layer: Any) -> bool:
    """Whether ``layer`` is channels_redis's core layer, whose groups are sorted sets that a
    ZCARD can size (the pub/sub layer keeps none: each send is one PUBLISH anyway)."""
    try:
        from channels_redis.core import RedisChannelLayer
    except ImportError:  # pragma: no cover - channels_redis is a dependency
        return False
    return isinstance(layer, RedisChannelLayer)


async def with_members(layer: Any, groups: list[str]) -> set[str]:
    """The groups among ``groups`` that have a member somewhere (all of them when the layer
    cannot say, or failed to: their sends then fail, and are retried, as before)."""
    if not _counts_members(layer):
        return set(groups)
    loop = asyncio.get_running_loop()
    sizes = _group_sizes.get(loop)
    if sizes is None or sizes.layer is not layer:
        sizes = _group_sizes[loop] = _GroupSizes(layer)
    try:
        return await sizes.ask(groups)
    except Exception:
        return set(groups)


# --- joining and leaving groups together -----------------------------------------------------


def groups_together(layer: Any) -> bool:
    """Whether ``layer`` is channels_redis's core layer with its own ``group_add`` and
    ``group_discard`` (neither overridden nor wrapped): their commands can then be sent together
    (:func:`group_calls_of`). Any other layer gets its own calls, one per group."""
    if not _counts_members(layer):
        return False
    from channels_redis.core import RedisChannelLayer

    kind = type(layer)
    return (
        kind.group_add is RedisChannelLayer.group_add
        and kind.group_discard is RedisChannelLayer.group_discard
        and "group_add" not in vars(layer)
        and "group_discard" not in vars(layer)
    )


#: the most calls one script of :func:`group_calls_of` runs (each ~2 µs in Redis)
GROUP_CALLS_AT_ONCE = 500

#: a call of :func:`group_calls_of`: the layer's method ("group_add" or "group_discard"), the
#: group and the channel
GroupCall = tuple[str, str, str]

#: KEYS the groups' keys; ARGV now, the groups' expiry, then per key "a" (join) or "d"
#: (leave) and the channel: channels_redis's own commands for each, in order
_GROUP_CALLS = """
local now, expiry = ARGV[1], ARGV[2]
for i, key in ipairs(KEYS) do
  local channel = ARGV[2 + 2 * i]
  if ARGV[1 + 2 * i] == 'a' then
    redis.call('ZADD', key, now, channel)
    redis.call('EXPIRE', key, expiry)
  else
    redis.call('ZREM', key, channel)
  end
end
return #KEYS
"""


async def group_calls_of(layer: Any, calls: Sequence[GroupCall]) -> list[Exception | None]:
    """Joins (``group_add``) and leaves (``group_discard``) of channels_redis's core layer
    (:func:`groups_together`), of any groups and channels, in the order given: one script
    call per layer server, which runs the layer's own commands for each (a ZADD and an
    EXPIRE per join, a ZREM per leave). The layer's own calls cost two round trips per join
    and one per leave, and a reconnect storm joins a group per account and per user watched
    (a pipeline of those commands cost 2.5x the script's client time per call). Each call's
    error (a server down, or refusing the script, fails its calls only), or None."""
    by_server: dict[int, list[int]] = {}
    for n, (_, group, _) in enumerate(calls):
        by_server.setdefault(layer.consistent_hash(group), []).append(n)
    results: list[Exception | None] = [None] * len(calls)
    for index, members in by_server.items():
        # A script runs alone on its server: a long batch (a sweep joining every watched
        # user's group again) goes in scripts of GROUP_CALLS_AT_ONCE calls, in one pipeline.
        chunks = [
            members[start : start + GROUP_CALLS_AT_ONCE]
            for start in range(0, len(members), GROUP_CALLS_AT_ONCE)
        ]
        try:
            async with layer_slot():
                client = layer.connection(index)
                if len(chunks) == 1:
                    replies = [await client.eval(*_group_script_args(layer, calls, members))]
                else:
                    async with client.pipeline(False) as pipe:
                        for chunk in chunks:
                            pipe.eval(*_group_script_args(layer, calls, chunk))
                        replies = await pipe.execute(raise_on_error=False)
        except Exception as error:
            for n in members:
                results[n] = error
            continue
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, Exception):
                for n in chunk:
                    results[n] = reply
    return results


def _group_script_args(layer: Any, calls: Sequence[GroupCall], chosen: list[int]) -> list[Any]:
    """EVAL's arguments for the ``chosen`` calls (EVAL, not EVALSHA: Redis caches the script
    by its text's digest, and a server that restarted needs no second round trip)."""
    keys: list[str] = []
    args: list[Any] = [time.time(), layer.group_expiry]
    for n in chosen:
        method, group, channel = calls[n]
        keys.append(layer._group_key(group))
        args += ["a" if method == "group_add" else "d", channel]
    return [_GROUP_CALLS, len(keys), *keys, *args]


# --- where sync code's announcements are sent from --------------------------------------------

#: the announcements held for the event loop whose database call is running (sent_from_this_loop)
_held: contextvars.ContextVar[list[Coroutine[Any, Any, None]] | None] = contextvars.ContextVar(
    "presence_held_announcements", default=None
)


@contextlib.asynccontextmanager
async def sent_from_this_loop() -> AsyncIterator[None]:
    """Within this block, the announcements sync code makes (a database call made through
    ``sync_to_async``, which runs in a copy of this context: its writes' receivers, its
    ``on_commit`` callbacks) are held, and sent from this loop, in order, when the block ends.
    They are sent even if the caller is cancelled meanwhile: what they announce was written."""
    held: list[Coroutine[Any, Any, None]] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        if held:
            await asyncio.shield(asyncio.ensure_future(_send_held(held)))


async def _send_held(held: list[Coroutine[Any, Any, None]]) -> None:
    for announcement in held:
        await announcement


def holding() -> bool:
    """Whether this sync code's announcements are held for an event loop (sent_from_this_loop)."""
    return _held.get() is not None


class _AnnouncerLoop:
    """One event loop thread per process for announcements from sync code.

    ``async_to_sync`` would start a new event loop per call, and with it a new connection to
    the channel layer's Redis (connect, HELLO, CLIENT SETINFO) for one small message.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            # A forked worker (gunicorn --preload) inherits the loop but not its thread.
            if self._loop is None or self._loop.is_closed() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="presence-announcer", daemon=True
                ).start()
            return self._loop


_announcer = _AnnouncerLoop()


def sync_loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop thread for sync code's async calls: its announcements
    (:func:`run_from_sync`), and the signals' outbox claims, which wait for a busy Redis as
    the live paths do (presence.outbox.run_live)."""
    return _announcer.loop()


def run_from_sync(coroutine: Coroutine[Any, Any, None], what: str) -> None:
    """Send an announcement from sync code: held for the event loop whose database call this
    is (:func:`sent_from_this_loop`), or else run on the announcer loop and waited for (at most
    a few socket timeouts), so that the sync caller's next step observes it."""
    held = _held.get()
    if held is not None:
        held.append(coroutine)
        return
    future = asyncio.run_coroutine_threadsafe(coroutine, _announcer.loop())
    try:
        future.result(timeout=get_settings().SOCKET_TIMEOUT * 4)
    except Exception as error:
        future.cancel()
        logger.warning("Presence: announcing %s timed out (%s).", what, error)
