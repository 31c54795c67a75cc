"""Reading presence as a viewer may see it: one user, many, online friends, who is online."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from presence import domain, relations, resolution
from presence.conf import get_settings
from presence.domain import Presence, UserId
from presence.operations import Operation, arun, call, redis, run
from presence.store import get_store
from presence.users import user_pk as _pk


def _target_ids(targets: Iterable[Any]) -> list[UserId]:
    return list(dict.fromkeys(_pk(target) for target in targets))


def _bulk_presence(targets: Iterable[Any], viewer: Any) -> Operation[dict[UserId, Presence]]:
    facts = yield from call(relations.load, viewer, _target_ids(targets), afunction=relations.aload)
    store = get_store()
    # Judged as of the start of the read (see resolution.is_news): a heartbeat landing while
    # the read is under way is then either in it or announced.
    now = resolution.now()
    live = yield from redis(store.plans.read(facts))
    return resolution.resolve_all(facts, live, now)


def bulk_presence(targets: Iterable[Any], viewer: Any) -> dict[UserId, Presence]:
    """Presence of many users as ``viewer`` may see it: one query, one Redis round trip.

    Ids of no user are left out of the result.
    """
    return run(_bulk_presence(targets, viewer))


async def abulk_presence(targets: Iterable[Any], viewer: Any) -> dict[UserId, Presence]:
    return await arun(_bulk_presence(targets, viewer))


def _online_among(users: Iterable[Any], viewer: Any) -> Operation[list[Any]]:
    given = list(users)
    presences = yield from _bulk_presence(given, viewer)
    online: list[Any] = []
    listed: set[UserId] = set()
    for user in given:
        user_id = _pk(user)
        # (ids of no user are left out, as bulk_presence leaves them; a user given twice once)
        if user_id in listed or user_id not in presences:
            continue
        listed.add(user_id)
        if presences[user_id].is_online:
            online.append(user)
    return online


def online_among(users: Iterable[Any], viewer: Any) -> list[Any]:
    """Those of ``users`` (users or ids) online as ``viewer`` may see them, in the order given,
    each as given (a user given twice listed once, ids of no user left out): who of the people
    who liked a post is online. :func:`bulk_presence`'s read, so the same privacy rules (blocks,
    invisible, the levels and exceptions) and cost: one query and one Redis round trip."""
    return run(_online_among(users, viewer))


async def aonline_among(users: Iterable[Any], viewer: Any) -> list[Any]:
    return await arun(_online_among(users, viewer))


def _get_presence(target: Any, viewer: Any) -> Operation[Presence]:
    presences = yield from _bulk_presence([target], viewer)
    return presences.get(_pk(target), domain.HIDDEN)


def get_presence(target: Any, viewer: Any) -> Presence:
    return run(_get_presence(target, viewer))


async def aget_presence(target: Any, viewer: Any) -> Presence:
    return await arun(_get_presence(target, viewer))


def _by_visible_recency(presences: dict[UserId, Presence], ids: Iterable[UserId]) -> list[UserId]:
    """``ids`` in an order only what the viewer sees decides: those whose last seen the viewer
    may see, most recent first, then the others by id. Their true activity never moves a
    hidden one (the order of a list of friends would tell it)."""
    shown: list[UserId] = []
    hidden: list[UserId] = []
    for user_id in ids:
        (hidden if presences[user_id].last_seen is None else shown).append(user_id)

    def recency(user_id: UserId) -> float:
        return presences[user_id].last_seen.timestamp()  # type: ignore[union-attr]

    # By id first, so that equal last seens too keep an order the database cannot change; a
    # float per friend, not a tuple: thousands of them at a time (the sort is stable).
    shown.sort()
    shown.sort(key=recency, reverse=True)
    hidden.sort()
    return shown + hidden


def most_recent_online(presences: dict[UserId, Presence], limit: int | None) -> list[UserId]:
    online = _by_visible_recency(presences, [u for u, p in presences.items() if p.is_online])
    return online if limit is None else online[:limit]


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}.")


def live_since(now: float) -> float:
    """Activity older than this is offline whatever its kind: a page view's window, a
    connection's TTL and a sign-off's grace all ran out (they count from the end of the
    event's second, domain.offline_at)."""
    conf = get_settings()
    return now - domain.SECOND - max(conf.ONLINE_WINDOW, conf.CONNECTION_TTL, conf.OFFLINE_GRACE)


def live_online(live: dict[UserId, domain.LiveState] | None, now: float) -> list[UserId]:
    timing = resolution.timing()
    return [
        user_id
        for user_id, state in (live or {}).items()
        if domain.live_status(state, now, timing) is not domain.Status.OFFLINE
    ]


@dataclass(frozen=True)
class _OnlineFriends:
    """The friends to list, most recent first, with what was read to list them."""

    found: relations.FactsAndUsers
    listed: list[UserId]
    presences: dict[UserId, Presence]
    #: every friend, and the time the read was judged at
    friends: list[UserId]
    now: float

    def users(self) -> list[Any]:
        return self.found.users(self.listed)

    def with_presence(self) -> list[tuple[Any, Presence]]:
        return [(user, self.presences[user.pk]) for user in self.users()]


def _read_online_friends(user: Any, limit: int | None) -> Operation[_OnlineFriends]:
    _check_limit(limit)
    store = get_store()
    friends = yield from call(relations.friend_ids, user, afunction=relations.afriend_ids)
    now = resolution.now()
    # Only the friends who may be live come back from Redis: the others cannot be listed.
    live = yield from redis(store.plans.read_recent(friends, live_since(now)))
    found = yield from call(
        relations.load_with_users,
        user,
        live_online(live, now),
        afunction=relations.aload_with_users,
    )
    presences = resolution.resolve_each(found.each_fact(), live, now)
    return _OnlineFriends(found, most_recent_online(presences, limit), presences, friends, now)


def online_friends_with_presence(user: Any, limit: int | None = None) -> list[tuple[Any, Presence]]:
    """Like :func:`online_friends`, with each friend's presence as ``user`` sees it."""
    return run(_read_online_friends(user, limit)).with_presence()


async def aonline_friends_with_presence(
    user: Any, limit: int | None = None
) -> list[tuple[Any, Presence]]:
    return (await arun(_read_online_friends(user, limit))).with_presence()


def online_friends(user: Any, limit: int | None = None) -> list[Any]:
    """Friends (mutual contacts) online and visible to ``user``, most recently active first.

    Redis is asked first (one round trip for all friends, answering only for those who may be
    live), then the privacy facts and the user rows of those friends are read together: two
    queries whatever the number of friends; only the users listed are built.
    """
    return run(_read_online_friends(user, limit)).users()


async def aonline_friends(user: Any, limit: int | None = None) -> list[Any]:
    return (await arun(_read_online_friends(user, limit))).users()


Listed = list[tuple[Any, Presence]]


def _watched_friends(user: Any, most: int) -> Operation[tuple[Listed, Listed]]:
    online = yield from _read_online_friends(user, most)
    room = most - len(online.listed)
    listed = set(online.listed)
    rest = [pk for pk in online.friends if pk not in listed]
    if room <= 0 or not rest:
        return online.with_presence(), []
    found = yield from call(
        relations.load_with_users, user, rest, afunction=relations.aload_with_users
    )
    live = yield from redis(get_store().plans.read(rest))
    presences = resolution.resolve_each(found.each_fact(), live, online.now)
    others = found.users(_by_visible_recency(presences, presences)[:room])
    return online.with_presence(), [(other, presences[other.pk]) for other in others]


def watched_friends(user: Any, most: int) -> tuple[Listed, Listed]:
    """What a live online-friends list holds (``{% online_friends_list %}``): at most ``most``
    friends, each with the presence ``user`` may see. First the online ones, as
    :func:`online_friends_with_presence` lists them; then the others, in an order only what
    ``user`` may see decides (their last seen where shown, most recent first, then by id), so
    neither the order nor who is left out past ``most`` tells a hidden friend's activity.

    Three queries (friend ids; facts and rows of the online ones; of the others) and two Redis
    round trips whatever the number of friends; the others' cost grows with their number
    (each is resolved to be placed), and only the users listed are built."""
    return run(_watched_friends(user, most))


def online_now(viewer: Any) -> list[UserId]:
    """Ids of every user online now as ``viewer`` may see them, most recently active first.

    A report (the admin's "online now" filter), not for request paths: it visits every bucket,
    ``BUCKETS / CLEANUP_BATCH`` round trips, then loads the privacy facts of the online users in
    one query, so it costs O(users online now). Raises StoreUnavailable when Redis is down."""
    presences = bulk_presence(live_user_ids(), viewer)
    return most_recent_online(presences, None)


async def aonline_now(viewer: Any) -> list[UserId]:
    """:func:`online_now` from async code (an async admin view): the report runs in the
    database's thread, its round trips as the sync face sends them."""
    return await sync_to_async(online_now)(viewer)


def live_user_ids() -> list[UserId]:
    """Ids of every user online now, whoever may see it (invisible users too): the candidates
    of :func:`online_now`, not filtered by privacy. Only for presence.admin's true view of
    moderators granted ``presence.view_true_presence``; every other caller resolves them as a
    viewer (:func:`online_now`). Visits every bucket; raises StoreUnavailable when Redis is
    down."""
    conf = get_settings()
    store = get_store()
    now = resolution.now()
    timing = resolution.timing()
    since = live_since(now)
    live: list[UserId] = []
    for start in range(0, conf.BUCKETS, conf.CLEANUP_BATCH):
        buckets = range(start, min(start + conf.CLEANUP_BATCH, conf.BUCKETS))
        for user_id, state in store.run(store.plans.scan_recent(list(buckets), since)):
            if domain.live_status(state, now, timing) is not domain.Status.OFFLINE:
                live.append(user_id)
    return live
