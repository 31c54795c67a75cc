"""rooms_peers: a room's storage, ours beside two peers' layouts, row by row (issue 37).

The peers, on the same Redis and the same machine, in the same run:

- **Centrifugo's Redis presence** (centrifugal/centrifuge, ``internal/redis_lua``): a hash of
  each connection's info (a protobuf ClientInfo: user and client id) and a sorted set of
  their expiry times, driven by scripts written after its own: add (HSET + ZADD, both keys'
  EXPIRE renewed), remove (HDEL + ZREM) and get (the expired removed, then HGETALL); its count
  of a channel's users without user mapping (its default) is the whole presence read and its
  distinct users counted. No privacy: everyone in the room is read.
- **django-channels-presence** (``django-channels-presence-4-0`` from PyPI, the ``bench``
  extra): a row per connection (``Presence``: room, channel name, user, last seen), its
  queries as the library writes them; SQLite, and PostgreSQL too when ``DATABASE_URL`` or
  ``BENCH_POSTGRES_URL`` names one (a database named after it with ``_peers`` appended, created
  when missing). Its add and remove also call the channel layer and send a signal: only their
  storage part is timed here. No privacy either. Skipped with a note when not installed.

Rows, each at two room sizes (10,000 and 100,000 members; ``--quick`` 1,000 and 10,000), every
implementation timed one operation at a time in a shuffled order, medians on the client:

- **join / leave, storage op**: one member more (one connection) and out again (ours: the
  store's join and leave plans, its scripts; the member stays for OFFLINE_GRACE, as a real
  leave does).
- **a stranger reads the first 100** of a room whose members keep the default privacy (their
  online status shown to their contacts): ours end to end (``api.room_presence``: the rule, the
  viewer's ties, the room's read, the resolver), which lists nobody and counts everyone.
- **a viewer who sees all reads the first 100** (``DEFAULT_PRIVACY`` "everyone"): ours lists 100.
  Ours end to end as a page's read is, one after another: each takes what the read before it
  resolved of the members (presence.rooms.shared's known members), proven unchanged by the
  change stamps in the round trip of its room read.
- **count**, **memory per member** (``MEMORY USAGE`` of the room's keys; a table's growth in
  pages on SQLite, ``pg_total_relation_size`` on PostgreSQL), **prune per member** (a room of
  N members whose stays all ended, emptied: ours by the sweep's prune plan, PRUNE_BATCH at a
  time; Centrifugo's by its get script; the library's ``prune_presences`` query).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from benchmarks.bench_fanout import make_users
from benchmarks.bench_rooms import JOIN_STEP, connection_id, fill_room, room_bytes
from benchmarks.common import (
    Report,
    Sizes,
    activity_scores,
    fill_buckets,
    flush,
    median,
    raw_client,
    say,
    store,
)
from presence import api
from presence.conf import STAMP_SLACK
from presence.rooms.writes import PRUNE_BATCH

NAME = "rooms_peers"
BASE_ID = 9_000_001
#: the settings of every part: rooms of the kind "lobby" (anyone logged in), stays that
#: outlast the run, no sweep in the way
SETTINGS = {
    "ROOMS": {"lobby": None},
    "SWEEP_INTERVAL": 3600,
    "CONNECTION_TTL": 7200,
    # the fills of 100,000 members, pipelined, on a loaded machine
    "SOCKET_TIMEOUT": 60,
}
#: what each read lists
LIST = 100
#: one operation each, per sample
SAMPLES = 200


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(ops: dict[str, Callable[[int], Any]], samples: int) -> dict[str, float]:
    """Each op called with 0..samples-1, the implementations in a shuffled order each time;
    the median seconds of each."""
    times: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    for n in range(samples):
        random.shuffle(names)
        for name in names:
            times[name].append(_time(lambda op=ops[name], n=n: op(n)))  # type: ignore[misc]
    return {name: median(values) for name, values in times.items()}


# --- ours ---------------------------------------------------------------------------------------


class Ours:
    label = "ours"

    def __init__(self, size: int, users: list[Any]) -> None:
        self.size, self.users = size, users
        self.hidden, self.public = f"lobby:hidden-{size}", f"lobby:public-{size}"
        self.ids = [u.pk for u in users[:size]]
        self.extra = users[size:]

    def fill(self) -> None:
        now = time.time()
        fill_buckets(raw_client(), store(), activity_scores(self.ids, int(now), 60))
        # joined a millisecond apart, as joins come (not all in one millisecond, whose members
        # a read takes together), the earliest a while ago
        start = now - self.size * JOIN_STEP
        fill_room(self.hidden, self.ids, start, public=False)
        fill_room(self.public, self.ids, start, public=True)

    def join(self, n: int) -> Any:
        s, uid = store(), self.extra[n].pk
        # default privacy, as the consumer's join writes it: not public
        plan = s.plans.join_room(self.hidden, uid, connection_id(uid), time.time(), public=False)
        return s.run(plan)

    def leave(self, n: int) -> Any:
        s, uid = store(), self.extra[n].pk
        return s.run(s.plans.leave_room(self.hidden, uid, connection_id(uid), time.time()))

    def stranger_read(self, viewer: Any) -> dict[str, Any]:
        return api.room_presence(self.hidden, viewer)

    def open_read(self, viewer: Any) -> dict[str, Any]:
        return api.room_presence(self.public, viewer)

    def count(self) -> int:
        s = store()
        return s.run(s.plans.room_count(self.hidden, time.time())) or 0

    def memory(self) -> float:
        return sum(room_bytes(self.public).values()) / self.size

    def prune(self, size: int) -> float:
        """Seconds per member to empty a room of ``size`` members whose stays ended."""
        room, s = f"lobby:expired-{size}", store()
        past = time.time() - 3 * 7200
        # their room_entered claimed at their joins (fill_room): the sweep claims none
        fill_room(room, self.ids[:size], past, public=False)
        now, gone = time.time(), 0
        start = time.perf_counter()
        while True:
            users = s.run(s.plans.prune_room(room, now, PRUNE_BATCH)).gone
            gone += len(users)
            if not users:
                break
        took = time.perf_counter() - start
        assert gone == size, (gone, size)
        raw_client().zrem(s.keys.room_schedule_key(room), room)
        return took / size


# --- Centrifugo's layout ------------------------------------------------------------------------

# Written after centrifuge's internal/redis_lua scripts (user mapping off, no hash-field TTL).
CF_ADD = """
redis.call('hset', KEYS[2], ARGV[3], ARGV[4])
redis.call('expire', KEYS[2], ARGV[1])
redis.call('zadd', KEYS[1], ARGV[2], ARGV[3])
redis.call('expire', KEYS[1], ARGV[1])
"""
CF_REM = """
redis.call('hdel', KEYS[2], ARGV[1])
redis.call('zrem', KEYS[1], ARGV[1])
"""
_CF_PRUNE = """
local expired = redis.call('zrangebyscore', KEYS[1], '0', ARGV[1])
if #expired > 0 then
  for n = 1, #expired do redis.call('hdel', KEYS[2], expired[n]) end
  redis.call('zremrangebyscore', KEYS[1], '0', ARGV[1])
end
"""
CF_GET = _CF_PRUNE + "return redis.call('hgetall', KEYS[2])"


def client_info(user_id: int, client: str) -> bytes:
    """centrifuge's protocol.ClientInfo {user = 1, client = 2} as protobuf bytes."""
    user, cid = str(user_id).encode(), client.encode()
    return bytes([0x0A, len(user)]) + user + bytes([0x12, len(cid)]) + cid


class Centrifugo:
    label = "Centrifugo's Redis"

    def __init__(self, size: int, users: list[Any]) -> None:
        self.size, self.users = size, users
        self.client = raw_client()
        self.add = self.client.register_script(CF_ADD)
        self.rem = self.client.register_script(CF_REM)
        self.get = self.client.register_script(CF_GET)
        self.clients = [str(uuid.uuid4()) for _ in users]

    def keys(self, room: str) -> list[str]:
        return [f"centrifugo.presence.expire.{room}", f"centrifugo.presence.data.{room}"]

    def _add(self, pipe: Any, room: str, n: int, expire_at: int) -> Any:
        info = client_info(self.users[n].pk, self.clients[n])
        return self.add(self.keys(room), [7200, expire_at, self.clients[n], info], client=pipe)

    def fill(self, room: str = "room", size: int | None = None, expire_at: int = 0) -> None:
        at = expire_at or int(time.time()) + 7200
        pipe = self.client.pipeline(transaction=False)
        for n in range(size or self.size):
            self._add(pipe, room, n, at)
            if n % 1000 == 999:
                pipe.execute()
        pipe.execute()

    def join(self, n: int) -> Any:
        return self._add(self.client, "room", self.size + n, int(time.time()) + 7200)

    def leave(self, n: int) -> Any:
        return self.rem(self.keys("room"), [self.clients[self.size + n]])

    def read(self) -> list[Any]:
        flat = self.get(self.keys("room"), [int(time.time())])
        return flat[1 : 2 * LIST : 2]  # the first 100 of the whole room's infos

    def count(self) -> int:
        # PresenceStats without user mapping (its default): the whole presence read, its
        # distinct users counted (the stats script's HLEN counts connections, with mapping on)
        flat = self.get(self.keys("room"), [int(time.time())])
        return len({info[2 : 2 + info[1]] for info in flat[1::2]})

    def memory(self) -> float:
        return sum(int(self.client.memory_usage(k, samples=0) or 0) for k in self.keys("room")) / (
            self.size
        )

    def prune(self, size: int) -> float:
        room = f"expired-{size}"
        self.fill(room, size, int(time.time()) - 10)
        took = _time(lambda: self.get(self.keys(room), [int(time.time())]))
        assert self.client.hlen(self.keys(room)[1]) == 0
        return took / size


# --- django-channels-presence -------------------------------------------------------------------


class Channels:
    """django-channels-presence's storage, its queries as its models write them, on a database
    alias."""

    def __init__(self, size: int, users: list[Any], alias: str) -> None:
        from channels_presence.models import Presence, Room

        self.presence, self.room_model = Presence, Room
        self.size, self.users, self.alias = size, users, alias
        self.vendor = connections[alias].vendor
        self.label = f"channels-presence ({'SQLite' if self.vendor == 'sqlite' else 'PostgreSQL'})"

    def _room(self, name: str) -> Any:
        room, _ = self.room_model.objects.using(self.alias).get_or_create(channel_name=name)
        return room

    def fill(self, name: str = "room", size: int | None = None, age: float = 0) -> Any:
        room = self._room(name)
        seen = timezone.now() - timedelta(seconds=age)
        rows = [
            self.presence(room=room, channel_name=f"specific.{u.pk}", user_id=u.pk, last_seen=seen)
            for u in self.users[: size or self.size]
        ]
        self.presence.objects.using(self.alias).bulk_create(rows, batch_size=2000)
        self.room = room if name == "room" else getattr(self, "room", room)
        return room

    def join(self, n: int) -> Any:
        # Room.add_presence's storage: get_or_create of the row (then group_add and a signal)
        # (user_id: the user row of this database, not the instance read from the default one)
        user = self.users[self.size + n]
        return self.presence.objects.using(self.alias).get_or_create(
            room=self.room, channel_name=f"specific.{user.pk}", user_id=user.pk
        )

    def leave(self, n: int) -> Any:
        # Room.remove_presence's storage: the row read, then deleted
        user = self.users[self.size + n]
        row = self.presence.objects.using(self.alias).get(
            room=self.room, channel_name=f"specific.{user.pk}"
        )
        return row.delete()

    def _users(self) -> Any:
        # Room.get_users
        model = type(self.users[0])
        return model.objects.using(self.alias).filter(presence__room=self.room).distinct()

    def read(self) -> list[Any]:
        return list(self._users()[:LIST])

    def count(self) -> int:
        return int(self._users().count())

    def table_bytes(self) -> int:
        """The presence table's bytes with its indexes (the rooms' table is one row a room)."""
        with connections[self.alias].cursor() as cursor:
            if self.vendor == "sqlite":
                cursor.execute(
                    "SELECT SUM(pgsize) FROM dbstat WHERE name IN (SELECT name FROM "
                    "sqlite_master WHERE tbl_name = 'channels_presence_presence')"
                )
            else:
                cursor.execute("SELECT pg_total_relation_size('channels_presence_presence')")
            return int(cursor.fetchone()[0] or 0)

    def prune(self, size: int) -> float:
        room = self.fill(f"expired-{size}", size, age=3600)
        # Room.prune_presences(age): one delete of the rows last seen before it
        took = _time(
            lambda: (
                self.presence.objects.using(self.alias)
                .filter(room=room, last_seen__lt=timezone.now() - timedelta(seconds=60))
                .delete()
            )
        )
        return took / size


def channels_aliases() -> list[str]:
    if "channels_presence" not in settings.INSTALLED_APPS:
        say(
            "  (django-channels-presence is not installed: its columns are left out; "
            "pip install -e '.[bench]')"
        )
        return []
    return [alias for alias in ("default", "peers_postgres") if alias in settings.DATABASES]


# --- the run ------------------------------------------------------------------------------------


def one_size(report: Report, size: int, users: list[Any], samples: int) -> None:
    say(f"\n  -- a room of {size:,} members --")
    ours = Ours(size, users)
    peers: list[Any] = [Centrifugo(size, users)]
    peers += [Channels(size, users, alias) for alias in channels_aliases()]
    viewer = users[-1]
    # The viewer online as a page's reader is, through the store: the site's change stamps
    # begin (a running site's have long begun; a read proves what it takes from an earlier
    # read by them, presence.rooms.shared)
    s, online = store(), time.time()
    s.run(s.plans.connection(viewer.pk, "open", online, "bench"))
    ours.fill()
    for peer in peers:
        peer.fill()
    tables = {p.label: p.table_bytes() / size for p in peers if isinstance(p, Channels)}
    figures: dict[str, dict[str, float]] = {}

    def row(name: str, values: dict[str, float]) -> None:
        figures[name] = values

    everyone = [ours, *peers]
    row("join, storage op", side_by_side({i.label: i.join for i in everyone}, samples))
    row("leave, storage op", side_by_side({i.label: i.leave for i in everyone}, samples))

    # (the stamps prove nothing within the clocks' slack of their beginning)
    time.sleep(max(0.0, online + STAMP_SLACK + 0.5 - time.time()))
    stranger = ours.stranger_read(viewer)
    # (the leavers above are counted for their OFFLINE_GRACE)
    assert not stranger["members"] and stranger["count"] >= size, (stranger["count"], size)
    reads = {i.label: (lambda n, i=i: i.read()) for i in peers}
    row(
        "a stranger reads the first 100",
        side_by_side({ours.label: lambda n: ours.stranger_read(viewer), **reads}, samples // 2),
    )
    with override_settings(
        PRESENCE={**SETTINGS, "DEFAULT_PRIVACY": {"online_visibility": "everyone"}}
    ):
        seen = ours.open_read(viewer)
        assert len(seen["members"]) == LIST and seen["count"] == size, len(seen["members"])
        row(
            "a viewer who sees all reads the first 100",
            side_by_side({ours.label: lambda n: ours.open_read(viewer), **reads}, samples // 2),
        )
    assert size <= ours.count() <= size + samples, ours.count()  # leavers stay their grace
    row("count", side_by_side({i.label: (lambda n, i=i: i.count()) for i in everyone}, samples))
    memory = {ours.label: ours.memory()}
    for peer in peers:
        memory[peer.label] = tables.get(peer.label) or peer.memory()
    row("memory per member (B)", memory)
    pruned = min(size, 10_000)
    prune = {i.label: i.prune(pruned) for i in everyone}
    row(f"prune {pruned:,} expired, per member", prune)

    labels = [i.label for i in everyone]
    for name, values in figures.items():
        ours_value = values[ours.label]

        def shown(v: float, name: str = name) -> str:
            if name.startswith("memory"):
                return f"{v:.0f} B"
            if name.startswith("prune"):
                return f"{v * 1e6:.1f} µs"
            return f"{v * 1000:.2f} ms"

        text = " / ".join(shown(values[label]) for label in labels)
        goal, passed = goal_of(name, values, ours_value, labels[1])
        report.add(NAME, f"{size:,}: {name} ({' / '.join(labels)})", text, goal, passed)


def goal_of(
    name: str, values: dict[str, float], ours: float, centrifugo: str
) -> tuple[str, bool | None]:
    others = [v for label, v in values.items() if label != "ours"]
    if name.startswith(("join", "leave")):
        return "ours ≤ Centrifugo's", ours <= values[centrifugo]
    if name.startswith("a "):
        return "≤ 2 ms", ours <= 0.002
    if name.startswith("prune"):
        return "≤ 2x Centrifugo's", ours <= 2 * values[centrifugo]
    return "ours < each peer", all(ours < v for v in others)


def run(sizes: Sizes, report: Report) -> None:
    quick = report.quick
    small, big = (1_000, 10_000) if quick else (10_000, 100_000)
    samples = 60 if quick else SAMPLES
    say(
        f"\n== rooms_peers: ours beside Centrifugo's Redis presence and django-channels-presence,"
        f" rooms of {small:,} and {big:,} members =="
    )
    aliases = channels_aliases()
    flush(raw_client())
    _empty_peers(aliases)  # what a run cut short left in the (kept) PostgreSQL database
    with override_settings(PRESENCE=SETTINGS):
        users = make_users(BASE_ID, big + samples + 1, "peer")
        if "peers_postgres" in aliases:
            model = type(users[0])
            model._default_manager.db_manager("peers_postgres").bulk_create(
                users, batch_size=2000, ignore_conflicts=True
            )
        for size in (small, big):
            one_size(report, size, users, samples)
            flush(raw_client())
            _empty_peers(aliases)
    _empty_peers(aliases)
    _drop_users(aliases, len(users))


def _empty_peers(aliases: list[str]) -> None:
    """The peers' rows gone (TRUNCATE on PostgreSQL: the table's size, the memory row, is then
    its live rows' only)."""
    if not aliases:
        return
    from channels_presence.models import Presence, Room

    for alias in aliases:
        if connections[alias].vendor == "postgresql":
            with connections[alias].cursor() as cursor:
                cursor.execute(f"TRUNCATE {Presence._meta.db_table}, {Room._meta.db_table}")
        else:
            Presence.objects.using(alias).all()._raw_delete(alias)
            Room.objects.using(alias).all()._raw_delete(alias)


def _drop_users(aliases: list[str], count: int) -> None:
    """The run's ``count`` users gone: one DELETE per database, without the per-user erase of
    presence's delete receiver (100,000 of them; nothing else of these users is in the
    database, and Redis is flushed)."""
    from django.contrib.auth import get_user_model

    for alias in {"default", *aliases}:
        # Only this benchmark's ids: other benchmarks' users (above and below) keep their rows.
        mine = (
            get_user_model()
            ._default_manager.db_manager(alias)
            .filter(pk__gte=BASE_ID, pk__lt=BASE_ID + count)
        )
        mine._raw_delete(alias)
