"""All of presence's settings, with their defaults, in one place.

Sites set an optional ``PRESENCE`` dict; every key is optional. Values are read once and cached;
the cache is cleared when ``PRESENCE`` changes (``override_settings`` in tests).
Validation lives in :mod:`presence.checks` so a bad value is reported by ``manage.py check``
with an id and a hint instead of failing at import time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver


class FrozenMapping(Mapping[str, Any]):
    """A read-only mapping, hashable as a frozen dataclass's defaults must be (equal to any
    mapping, a dict included, with the same items)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items(), key=repr)))

    def __repr__(self) -> str:
        return repr(self._items)


@dataclass(frozen=True)
class PresenceSettings:
    CACHE_ALIAS: str = "default"
    #: startup node URLs of a Redis Cluster holding all of presence's state (redis-py's
    #: RedisCluster); None: the Redis of CACHE_ALIAS
    REDIS_CLUSTER: tuple[str, ...] | None = None
    KEY_PREFIX: str = "presence"
    #: seconds since the last authenticated request that still count as online
    ONLINE_WINDOW: int = 300
    #: the middleware writes one user at most once per interval per process
    TOUCH_INTERVAL: int = 30
    HEARTBEAT_INTERVAL: int = 30
    CONNECTION_TTL: int = 90
    IDLE_AFTER: int = 300
    #: seconds after going offline (last connection closed, logout) before others see it
    OFFLINE_GRACE: int = 5
    MAX_SUBSCRIPTIONS: int = 1000
    RATE_LIMIT: tuple[int, int] = (60, 10)
    #: the visibility levels of a user without a PrivacySettings row, by setting
    #: (online_visibility, last_seen_visibility, activity_visibility -> everyone, contacts,
    #: close_friends or nobody); a setting left out is "contacts". Read through
    #: presence.models.privacy_defaults; presence.E010 reports a bad value
    DEFAULT_PRIVACY: Mapping[str, str] = FrozenMapping()
    #: room kinds a site declares: kind -> dotted path of ``can_enter(user, room_id) -> bool``,
    #: or None to let any authenticated user in; an undeclared kind is refused (docs/rooms.md).
    #: presence.E011 / E012 report bad values
    ROOMS: Mapping[str, str | None] = FrozenMapping()
    #: rooms one WebSocket connection may be in at once
    MAX_ROOMS: int = 10
    #: rooms whose count one WebSocket connection may watch at once (watch_room_count: an
    #: index page's live counts, which join no room)
    MAX_WATCHED_ROOMS: int = 100
    #: members listed by name in a room's state; the rest count in ``others``
    ROOM_LIST_LIMIT: int = 100
    #: dotted path of ``card(user) -> {"name": str, "avatar": url or None}``: how a member is
    #: shown in rooms and friends lists; None: full name else username, no avatar
    #: (presence.rooms.cards). presence.E013 reports a path that does not import or call
    MEMBER_CARD: str | None = None
    #: viewers who may not see a user's exact last seen get last_seen_approx instead (recently,
    #: within_week, within_month, long_ago; never across a block)
    APPROXIMATE_LAST_SEEN: bool = True
    #: a viewer who hides their own exact last seen from a user sees only that user's
    #: approximate last seen
    RECIPROCAL_LAST_SEEN: bool = False
    #: count distinct anonymous visitors within ONLINE_WINDOW (approximately, storing no
    #: identity) for guest_count; off: anonymous requests cost nothing
    COUNT_GUESTS: bool = False
    # --- additions to the contract (documented in docs/settings.md) ---
    #: number of Redis buckets the online sorted sets are split into (docs/redis-layout.md)
    BUCKETS: int = 16384
    #: on a Redis Cluster: hash tags the buckets and the schedules are spread over (each tag
    #: holds BUCKETS / CLUSTER_SHARDS buckets and their users' due times; see docs/redis-layout.md)
    CLUSTER_SHARDS: int = 256
    #: longest custom status text / activity, in characters
    TEXT_MAX_LENGTH: int = 140
    #: longest custom status emoji, in characters (some emoji are several code points)
    EMOJI_MAX_LENGTH: int = 16
    #: longest custom status expiry, in seconds
    MAX_STATUS_EXPIRY: int = 30 * 24 * 3600
    #: live WebSocket connections one user may have; past it a new one is closed with 4429
    MAX_CONNECTIONS_PER_USER: int = 20
    #: seconds a token of presence.tokens stays valid (native and mobile clients)
    TOKEN_MAX_AGE: int = 30 * 24 * 3600
    #: Redis socket timeout (seconds) when the cache's OPTIONS set none: a slow Redis must not
    #: hold a page for long
    SOCKET_TIMEOUT: float = 0.5
    #: how long the live paths (consumers, the hub, sweeps) wait for a reply of a busy Redis:
    #: a slow reply there is back-pressure, waited for; only a Redis that cannot be reached,
    #: or that stays silent this long, is an outage
    LIVE_SOCKET_TIMEOUT: float = 5.0
    #: after a Redis error, skip Redis for this many seconds before trying again
    RETRY_INTERVAL: float = 2.0
    #: buckets read per round trip by presence_cleanup
    CLEANUP_BATCH: int = 256
    #: longest WebSocket frame a client may send, in bytes (a subscribe of 1,000 ids is ~12 KB)
    MAX_FRAME_BYTES: int = 65536
    #: a live socket checks, on a heartbeat at most once per this many seconds, that its Django
    #: session still exists and still logs its user in (deleted or expired sessions; logouts and
    #: password changes close sockets at once anyway)
    SESSION_CHECK_INTERVAL: int = 30
    #: changes of one user arriving within this many seconds are sent as one diff
    COALESCE_WINDOW: float = 0.2
    #: how often each live process looks for users due to turn offline (crashed connections,
    #: the end of OFFLINE_GRACE, ONLINE_WINDOW) and custom statuses due to expire, in seconds
    SWEEP_INTERVAL: float = 1.0
    #: users one sweep handles per round trip
    SWEEP_BATCH: int = 500
    #: at most this many HTTP writes (status changes, posts, group joins and leaves) per user in
    #: each window of this many seconds, across processes (presence.ratelimit); None: no limit
    HTTP_RATE_LIMIT: tuple[int, int] | None = (30, 60)
    #: at most this many user ids read per user through GET presence/api/presence in each window
    #: of this many seconds, across processes (presence.ratelimit; a request counts as the ids
    #: it asks for, at least 25); None: no limit. Ten full requests (500 ids) a minute
    HTTP_READ_LIMIT: tuple[int, int] | None = (5000, 60)
    #: bytes the server may hold unsent for one WebSocket connection (a client that does not
    #: read); past it the connection is closed with 4408. Above the largest snapshot
    #: (MAX_SUBSCRIPTIONS presences of up to ~3.6 KB each with the longest custom statuses)
    MAX_UNSENT_BYTES: int = 4 * 1024 * 1024
    #: sockets' openings (joining the hub, the opening write, the first subscribe's snapshot) a
    #: process works on at once; the others are accepted and wait their turn (presence.admission:
    #: a reconnect storm then costs what its openings cost one after another)
    OPENINGS_AT_ONCE: int = 24
    #: the longest an opening keeps its turn, in seconds (a socket that subscribes to nothing)
    OPENING_HOLD: float = 2.0
    #: the oldest stamp (a page's ``data-presence-since``, the ``stamp`` of a client's last
    #: snapshot) that still gets only what changed since it, in seconds; older: a full snapshot
    RESUME_WINDOW: int = 300


#: how far apart the clocks of the site's hosts (and a page's render and its socket) may be, in
#: seconds: change stamps are compared with this slack either way (presence.stamps)
STAMP_SLACK = 2.0


def stamps_kept(conf: PresenceSettings) -> float:
    """How long a change stamp is kept in Redis, in seconds: any older is older than every
    stamp still accepted (RESUME_WINDOW), however far apart the clocks are (STAMP_SLACK)."""
    return conf.RESUME_WINDOW + 4 * STAMP_SLACK


SETTING_NAMES = frozenset(f.name for f in fields(PresenceSettings))

#: the activity feed's settings (PRESENCE_FEED, presence.feed.conf.SETTING_NAMES: a test keeps
#: the two equal), named here because the core may not import the feed; left in PRESENCE they
#: are reported by the feed's check when it is installed, else by presence.W001
FEED_SETTING_NAMES = frozenset(
    {"ACTIVITY_MAX_LENGTH", "RECORD_STATUS_ACTIVITIES", "MENTION_URL", "HANDLE_FIELD", "CAN_READ"}
)


def user_settings() -> Any:
    return getattr(django_settings, "PRESENCE", {})


@cache
def get_settings() -> PresenceSettings:
    raw = user_settings()
    if not isinstance(raw, dict):
        # presence.E001 reports this; run on defaults meanwhile.
        return PresenceSettings()
    known = {key: value for key, value in raw.items() if key in SETTING_NAMES}
    for pair in ("RATE_LIMIT", "HTTP_RATE_LIMIT", "HTTP_READ_LIMIT", "REDIS_CLUSTER"):
        if isinstance(known.get(pair), list):
            known[pair] = tuple(known[pair])
    if "DEFAULT_PRIVACY" in known:
        # A copy no one can change under the cache; not a mapping: presence.E010 reports it,
        # and until it is fixed the levels are contacts.
        levels = known["DEFAULT_PRIVACY"]
        known["DEFAULT_PRIVACY"] = FrozenMapping(levels if isinstance(levels, Mapping) else None)
    if "ROOMS" in known:
        # Not a mapping: presence.E011 reports it; until fixed no kind is declared.
        kinds = known["ROOMS"]
        known["ROOMS"] = FrozenMapping(kinds if isinstance(kinds, Mapping) else None)
    return PresenceSettings(**known)


@receiver(setting_changed)
def _clear_on_change(*, setting: str, **kwargs: object) -> None:
    if setting == "PRESENCE":
        get_settings.cache_clear()
