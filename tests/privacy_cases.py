"""The privacy matrix shared by every read path's tests, and honest counters for their costs.

The expected outcome of each case is computed here from the rules in docs/privacy.md with a small
table of its own (``ADMITS``), never by calling :func:`presence.domain.resolve`, so a mistake in
the resolver cannot hide behind the same mistake in the test.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import import_module
from typing import Any

import redis.asyncio.client
import redis.client
import time_machine
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.test import Client

from presence import api, signals
from presence.middleware import listener, throttle
from presence.models import Block, Contact, PrivacySettings, UserStatus

#: a fixed "now" with whole seconds (Redis keeps activity in whole seconds)
NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)
#: when an offline target was last active: long past ONLINE_WINDOW (300 s)
OFFLINE_SINCE = NOW - timedelta(hours=2)
YESTERDAY = NOW - timedelta(days=1)

LEVELS = ("everyone", "contacts", "close_friends", "nobody")
FIELDS = ("online_visibility", "last_seen_visibility", "activity_visibility")
RELATIONS = (
    "self",
    "contact",  # the target has the viewer among its contacts
    "close_friend",  # ... and marked the viewer a close friend
    "stranger",  # the viewer follows the target, but not the other way round
    "blocked_by_target",  # close friends both ways, then the target blocked the viewer
    "blocking_target",  # close friends both ways, then the viewer blocked the target
    "anonymous",
)

#: Who, besides the target themself, each visibility level lets in. A block hides regardless.
ADMITS: dict[str, frozenset[str]] = {
    "everyone": frozenset({"contact", "close_friend", "stranger", "anonymous"}),
    "contacts": frozenset({"contact", "close_friend"}),
    "close_friends": frozenset({"close_friend"}),
    "nobody": frozenset(),
}
DEFAULT_LEVELS = {name: "contacts" for name in FIELDS}
BLOCKED = frozenset({"blocked_by_target", "blocking_target"})
#: who online_friends may list the target for: mutual contacts with no block between them
FRIENDS = frozenset({"contact", "close_friend"})

CUSTOM = {"text": "Out for lunch", "emoji": "🍜", "activity": "Eating ramen"}
NO_CUSTOM = {"text": None, "emoji": None, "activity": None}


def _visibility_variants() -> list[dict[str, str] | None]:
    """Each level of each field with the other two at "everyone" (so only it can hide), plus
    None: a target without a PrivacySettings row (the defaults)."""
    variants: list[dict[str, str] | None] = [None]
    for name, level in itertools.product(FIELDS, LEVELS):
        variant = dict.fromkeys(FIELDS, "everyone") | {name: level}
        if variant not in variants:
            variants.append(variant)
    return variants


@dataclass(frozen=True)
class Case:
    #: None: no PrivacySettings row at all (or only ``invisible`` set), i.e. the defaults
    visibility: dict[str, str] | None
    relation: str
    invisible: bool
    target_online: bool

    @property
    def levels(self) -> dict[str, str]:
        return self.visibility or DEFAULT_LEVELS

    @property
    def id(self) -> str:
        if self.visibility is None:
            vis = "defaults"
        else:
            changed = [
                f"{k.split('_visibility')[0]}={v}"
                for k, v in self.visibility.items()
                if v != "everyone"
            ]
            vis = ",".join(changed) or "all=everyone"
        return "-".join(
            [
                vis,
                self.relation,
                "invisible" if self.invisible else "visible",
                "online" if self.target_online else "offline",
            ]
        )


CASES = [
    Case(visibility, relation, invisible, online)
    for visibility in _visibility_variants()
    for relation in RELATIONS
    for invisible in (False, True)
    for online in (True, False)
]
CASE_IDS = [case.id for case in CASES]


@dataclass(frozen=True)
class Expected:
    status: str
    last_seen: datetime | None
    devices: tuple[str, ...]
    text: str | None
    emoji: str | None
    activity: str | None
    #: only in one's own presence
    invisible: bool | None = None
    #: where last seen is hidden (no block): how long ago, to the UTC day
    last_seen_approx: str | None = None

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": self.status,
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
            "last_seen_approx": self.last_seen_approx,
            "devices": list(self.devices),
            "text": self.text,
            "emoji": self.emoji,
            "activity": self.activity,
        }
        if self.invisible is not None:
            data["invisible"] = self.invisible
        return data

    @property
    def online(self) -> bool:
        return self.status != "offline"


def expected(case: Case) -> Expected:
    """What the case's viewer must see, straight from the contract's rules."""
    true_status = "online" if case.target_online else "offline"
    true_last_seen = NOW if case.target_online else OFFLINE_SINCE
    true_devices = ("web", "mobile") if case.target_online else ()
    if case.relation == "self":
        return Expected(
            true_status, true_last_seen, true_devices, **CUSTOM, invisible=case.invisible
        )
    if case.relation in BLOCKED:
        return Expected("offline", None, (), **NO_CUSTOM)
    levels = case.levels
    sees_online = not case.invisible and case.relation in ADMITS[levels["online_visibility"]]
    sees_last_seen = sees_online and case.relation in ADMITS[levels["last_seen_visibility"]]
    sees_custom = case.relation in ADMITS[levels["activity_visibility"]]
    status = true_status if sees_online else "offline"
    return Expected(
        status=status,
        last_seen=true_last_seen if sees_last_seen else None,
        devices=true_devices if status != "offline" else (),
        **(CUSTOM if sees_custom else NO_CUSTOM),
        # Both last seen times of the cases are today, the one before yesterday: "recently".
        last_seen_approx=None if sees_last_seen else "recently",
    )


def expected_in_online_friends(case: Case) -> bool:
    return case.relation in FRIENDS and expected(case).online


@dataclass
class Scenario:
    case: Case
    target: Any
    #: None for an anonymous viewer
    viewer: Any
    others: list[Any] = field(default_factory=list)


def build(case: Case, make_user: Callable[..., Any]) -> Scenario:
    """Users, relations, choices and live state for ``case``. Call inside ``travel(NOW)``."""
    target = make_user()
    viewer: Any
    if case.relation == "self":
        viewer = target
    elif case.relation == "anonymous":
        viewer = None
    else:
        viewer = make_user()
        # The viewer follows the target in every case: what the viewer does never grants sight.
        Contact.objects.create(owner=viewer, contact=target)
        if case.relation in {"contact", "close_friend", *BLOCKED}:
            Contact.objects.create(
                owner=target, contact=viewer, close_friend=case.relation != "contact"
            )
        if case.relation == "blocked_by_target":
            Block.objects.create(blocker=target, blocked=viewer)
        elif case.relation == "blocking_target":
            Block.objects.create(blocker=viewer, blocked=target)
    if case.visibility is not None or case.invisible:
        PrivacySettings.objects.create(
            user=target, invisible=case.invisible, **(case.visibility or {})
        )
    UserStatus.objects.create(user=target, **CUSTOM)
    # Active yesterday too: the approximate last seen counts from the latest day before today,
    # which today's activity keeps beside the new last seen (Redis's prior set, every path).
    with time_machine.travel(YESTERDAY, tick=False):
        api.touch(target, "web")
    if case.target_online:
        api.touch(target, "web")
        api.touch(target, "mobile")
    else:
        with time_machine.travel(OFFLINE_SINCE, tick=False):
            api.touch(target, "web")
    return Scenario(case, target, viewer)


def quiet_login(client: Client, user: Any) -> None:
    """Log ``client`` in as ``user`` without recording activity.

    ``Client.force_login`` sends ``user_logged_in`` (which touches the user) and the middleware
    would touch them on the first request; either would change a target's state when the viewer
    is the target. The viewer's own activity is tested in the middleware's tests.
    """
    engine = import_module(settings.SESSION_ENGINE)
    session = engine.SessionStore()
    session[SESSION_KEY] = user._meta.pk.value_to_string(user)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    client.cookies[settings.SESSION_COOKIE_NAME] = session.session_key
    # The middleware writes a user at most once per TOUCH_INTERVAL: claim this interval, with
    # the closes listener already subscribed (a claim made before its subscription is not
    # trusted: presence.closes).
    listener.ensure()
    throttle.mark(user.pk)


# --- counting Redis round trips -------------------------------------------------------------


@dataclass
class RoundTrips:
    """Round trips to Redis made through redis-py, sync and async.

    Counted by wrapping the client classes: every ``Pipeline.execute`` with queued commands is
    one round trip, and so is every command sent outside a pipeline (``Redis.execute_command``;
    pipelines override it to queue), and so is a sync read the store begins early on a pooled
    connection itself (``store.begin``). ``commands`` lists what each round trip carried.
    """

    commands: list[list[str]] = field(default_factory=list)
    #: on a Redis Cluster, each round's commands per master: a round is sent to every master
    #: at once, so it counts as one round trip (and as one per master in ``per_master``)
    per_master: list[dict[str, int]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.commands)

    def reset(self) -> None:
        self.commands.clear()
        self.per_master.clear()


@contextlib.contextmanager
def count_round_trips() -> Iterator[RoundTrips]:
    # Every client in the process is counted: a transition's signal-outbox claim (a ZREM on
    # the receivers' thread, after the write that made it; a setup's touch) must not land in
    # the measured part late on a busy machine. Earlier work is let finish first.
    signals.wait_sent()
    trips = RoundTrips()
    patches = []

    def _names(stack: Any) -> list[str]:
        names = []
        for entry in stack:
            args = entry.args if hasattr(entry, "args") else entry[0]
            names.append(str(args[0]).upper())
        return names

    def wrap_execute(cls: type, is_async: bool) -> None:
        original = cls.execute  # type: ignore[attr-defined]
        if is_async:

            async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
                if self.command_stack:
                    trips.commands.append(_names(self.command_stack))
                return await original(self, *args, **kwargs)
        else:

            def execute(self: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                if self.command_stack:
                    trips.commands.append(_names(self.command_stack))
                return original(self, *args, **kwargs)

        patches.append((cls, "execute", original))
        cls.execute = execute  # type: ignore[attr-defined]

    def wrap_command(cls: type, is_async: bool) -> None:
        original = cls.execute_command  # type: ignore[attr-defined]
        if is_async:

            async def execute_command(self: Any, *args: Any, **kwargs: Any) -> Any:
                trips.commands.append([str(args[0]).upper()])
                return await original(self, *args, **kwargs)
        else:

            def execute_command(self: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                trips.commands.append([str(args[0]).upper()])
                return original(self, *args, **kwargs)

        patches.append((cls, "execute_command", original))
        cls.execute_command = execute_command  # type: ignore[attr-defined]

    def wrap_cluster_rounds() -> None:
        from presence.store.cluster import ClusterRunner, wire_args

        original = ClusterRunner._route

        def route(self: Any, manager: Any, commands: Any, positions: Any, *args: Any) -> Any:
            groups = original(self, manager, commands, positions, *args)
            if groups:
                trips.commands.append(
                    [
                        str(wire_args(commands[p])[0]).upper()
                        for _, node_positions in groups.values()
                        for p in node_positions
                    ]
                )
                trips.per_master.append(
                    {name: len(node_positions) for name, (_, node_positions) in groups.items()}
                )
            return groups

        patches.append((ClusterRunner, "_route", original))
        ClusterRunner._route = route  # type: ignore[method-assign]

    def wrap_begun_reads() -> None:
        # A sync read begun early (store.begin) is sent on a pooled connection, not through
        # a redis-py pipeline.
        from presence.store import client as store_client

        sent_init = store_client._Sent.__init__

        def init(self: Any, client: Any, commands: Any) -> None:
            trips.commands.append([str(store_client._wire(c)[0]).upper() for c in commands])
            sent_init(self, client, commands)

        patches.append((store_client._Sent, "__init__", sent_init))
        store_client._Sent.__init__ = init  # type: ignore[method-assign]

    wrap_begun_reads()
    wrap_cluster_rounds()
    wrap_execute(redis.client.Pipeline, is_async=False)
    wrap_execute(redis.asyncio.client.Pipeline, is_async=True)
    wrap_command(redis.client.Redis, is_async=False)
    wrap_command(redis.asyncio.client.Redis, is_async=True)
    # Pipelines inherit execute_command from Redis but override it; put theirs back.
    for cls in (redis.client.Pipeline, redis.asyncio.client.Pipeline):
        if "execute_command" not in cls.__dict__:
            raise AssertionError(f"{cls} no longer overrides execute_command")
    try:
        yield trips
    finally:
        for cls, name, original in reversed(patches):
            setattr(cls, name, original)
