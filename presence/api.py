"""The public Python API: record activity, read presence as a viewer may see it, choose a
status, follow/unfollow/close friends/block for a site's own graph, notify after bulk writes,
clean up.

Every function has an async twin prefixed ``a`` (``touch``/``atouch``, ``get_presence``/
``aget_presence``, ...) except :func:`cleanup` (a batch job for ``manage.py presence_cleanup``
and cron, not for request paths) and :func:`apply_change` (the step ``set_status`` shares with
the status endpoint and the WebSocket; use ``set_status``/``aset_status``). Targets and viewers
are users or user ids; an anonymous viewer (``None`` or ``AnonymousUser``) is a stranger.

The live connections' side (opening, heartbeats, sweeps, the hub's reads) is
:mod:`presence.lifecycle`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from presence import announce, domain, relations, rules
from presence.conf import get_settings
from presence.domain import InvalidInput, Presence, StatusChange, StatusChoice, UserId
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus
from presence.signals import presence_changed
from presence.store import get_store
from presence.users import user_pk as _pk

__all__ = [
    "InvalidInput",
    "Presence",
    "ablock",
    "abulk_presence",
    "afollow",
    "aget_presence",
    "anotify_changed",
    "aonline_friends",
    "aonline_friends_with_presence",
    "apply_change",
    "aset_close_friend",
    "aset_status",
    "asign_off",
    "atouch",
    "aunblock",
    "aunfollow",
    "block",
    "bulk_presence",
    "cleanup",
    "follow",
    "get_presence",
    "notify_changed",
    "online_friends",
    "online_friends_with_presence",
    "online_now",
    "set_close_friend",
    "set_status",
    "sign_off",
    "touch",
    "unblock",
    "unfollow",
]


# --- recording activity ---------------------------------------------------------------------


def touch(user: Any, device: str = "web") -> None:
    """Record activity of ``user`` now. Never raises for a Redis outage (it is logged).

    A user coming online is announced to open connections (once per online stretch)."""
    now = rules.now()
    store = get_store()
    transition = store.run(store.touch(_pk(user), domain.Device(device), now))
    if rules.is_news(transition, now):
        announce.announce([_pk(user)])


async def atouch(user: Any, device: str = "web") -> None:
    now = rules.now()
    store = get_store()
    transition = await store.arun(store.touch(_pk(user), domain.Device(device), now))
    if rules.is_news(transition, now):
        await announce.aannounce([_pk(user)])


def sign_off(user: Any, device: str = "web") -> None:
    """The user left on ``device`` (logout): persist last seen; offline once no device is left."""
    now = rules.now()
    store = get_store()
    store.run(store.sign_off(_pk(user), domain.Device(device), now))
    LastSeen.objects.record_many({_pk(user): now})


async def asign_off(user: Any, device: str = "web") -> None:
    now = rules.now()
    store = get_store()
    await store.arun(store.sign_off(_pk(user), domain.Device(device), now))
    await sync_to_async(LastSeen.objects.record_many)({_pk(user): now})


# --- reading presence -----------------------------------------------------------------------


def _target_ids(targets: Iterable[Any]) -> list[UserId]:
    return list(dict.fromkeys(_pk(target) for target in targets))


def bulk_presence(targets: Iterable[Any], viewer: Any) -> dict[UserId, Presence]:
    """Presence of many users as ``viewer`` may see it: one query, one Redis round trip.

    Ids of no user are left out of the result.
    """
    facts = relations.load(viewer, _target_ids(targets))
    store = get_store()
    # Judged as of the start of the read (see rules.is_news): a heartbeat landing while the
    # read is under way is then either in it or announced.
    now = rules.now()
    live = store.run(store.read(facts))
    return rules.resolve_all(facts, live, now)


async def abulk_presence(targets: Iterable[Any], viewer: Any) -> dict[UserId, Presence]:
    facts = await relations.aload(viewer, _target_ids(targets))
    store = get_store()
    now = rules.now()
    live = await store.arun(store.read(facts))
    return rules.resolve_all(facts, live, now)


def get_presence(target: Any, viewer: Any) -> Presence:
    return bulk_presence([target], viewer).get(_pk(target), domain.HIDDEN)


async def aget_presence(target: Any, viewer: Any) -> Presence:
    return (await abulk_presence([target], viewer)).get(_pk(target), domain.HIDDEN)


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


def _most_recent_online(presences: dict[UserId, Presence], limit: int | None) -> list[UserId]:
    online = _by_visible_recency(presences, [u for u, p in presences.items() if p.is_online])
    return online if limit is None else online[:limit]


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}.")


def _live_since(now: float) -> float:
    """Activity older than this is offline whatever its kind: a page view's window, a
    connection's TTL and a sign-off's grace all ran out (they count from the end of the
    event's second, domain.offline_at)."""
    conf = get_settings()
    return now - domain.SECOND - max(conf.ONLINE_WINDOW, conf.CONNECTION_TTL, conf.OFFLINE_GRACE)


def _live_online(live: dict[UserId, domain.LiveState] | None, now: float) -> list[UserId]:
    timing = rules.timing()
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

    def users(self) -> list[Any]:
        return self.found.users(self.listed)

    def with_presence(self) -> list[tuple[Any, Presence]]:
        return [(user, self.presences[user.pk]) for user in self.users()]


def _online_friends(
    found: relations.FactsAndUsers,
    live: dict[UserId, domain.LiveState] | None,
    now: float,
    limit: int | None,
) -> _OnlineFriends:
    presences = rules.resolve_each(found.each_fact(), live, now)
    return _OnlineFriends(found, _most_recent_online(presences, limit), presences)


def _read_online_friends(user: Any, limit: int | None) -> _OnlineFriends:
    _check_limit(limit)
    store = get_store()
    friends = relations.friend_ids(user)
    now = rules.now()
    # Only the friends who may be live come back from Redis: the others cannot be listed.
    live = store.run(store.read_recent(friends, _live_since(now)))
    found = relations.load_with_users(user, _live_online(live, now))
    return _online_friends(found, live, now, limit)


async def _aread_online_friends(user: Any, limit: int | None) -> _OnlineFriends:
    _check_limit(limit)
    store = get_store()
    friends = await relations.afriend_ids(user)
    now = rules.now()
    live = await store.arun(store.read_recent(friends, _live_since(now)))
    found = await relations.aload_with_users(user, _live_online(live, now))
    return _online_friends(found, live, now, limit)


def online_friends_with_presence(user: Any, limit: int | None = None) -> list[tuple[Any, Presence]]:
    """Like :func:`online_friends`, with each friend's presence as ``user`` sees it."""
    return _read_online_friends(user, limit).with_presence()


async def aonline_friends_with_presence(
    user: Any, limit: int | None = None
) -> list[tuple[Any, Presence]]:
    return (await _aread_online_friends(user, limit)).with_presence()


def online_friends(user: Any, limit: int | None = None) -> list[Any]:
    """Friends (mutual contacts) online and visible to ``user``, most recently active first.

    Redis is asked first (one round trip for all friends, answering only for those who may be
    live), then the privacy facts and the user rows of those friends are read together: two
    queries whatever the number of friends; only the users listed are built.
    """
    return _read_online_friends(user, limit).users()


async def aonline_friends(user: Any, limit: int | None = None) -> list[Any]:
    return (await _aread_online_friends(user, limit)).users()


def watched_friends(
    user: Any, most: int
) -> tuple[list[tuple[Any, Presence]], list[tuple[Any, Presence]]]:
    """What a live online-friends list holds (``{% online_friends_list %}``): at most ``most``
    friends, each with the presence ``user`` may see. First the online ones, as
    :func:`online_friends_with_presence` lists them; then the others, in an order only what
    ``user`` may see decides (their last seen where shown, most recent first, then by id), so
    neither the order nor who is left out past ``most`` tells a hidden friend's activity.

    Three queries (friend ids; facts and rows of the online ones; of the others) and two Redis
    round trips whatever the number of friends; the others' cost grows with their number
    (each is resolved to be placed), and only the users listed are built."""
    _check_limit(most)
    store = get_store()
    friends = relations.friend_ids(user)
    now = rules.now()
    live = store.run(store.read_recent(friends, _live_since(now)))
    online = _online_friends(
        relations.load_with_users(user, _live_online(live, now)), live, now, most
    )
    room = most - len(online.listed)
    listed = set(online.listed)
    rest = [pk for pk in friends if pk not in listed]
    if room <= 0 or not rest:
        return online.with_presence(), []
    found = relations.load_with_users(user, rest)
    presences = rules.resolve_each(found.each_fact(), store.run(store.read(rest)), now)
    others = found.users(_by_visible_recency(presences, presences)[:room])
    return online.with_presence(), [(other, presences[other.pk]) for other in others]


def online_now(viewer: Any) -> list[UserId]:
    """Ids of every user online now as ``viewer`` may see them, most recently active first.

    A report (the admin's "online now" filter), not for request paths: it visits every bucket,
    ``BUCKETS / CLEANUP_BATCH`` round trips, then loads the privacy facts of the online users in
    one query, so it costs O(users online now). Raises StoreUnavailable when Redis is down."""
    conf = get_settings()
    store = get_store()
    now = rules.now()
    timing = rules.timing()
    since = _live_since(now)
    live: list[UserId] = []
    for start in range(0, conf.BUCKETS, conf.CLEANUP_BATCH):
        buckets = range(start, min(start + conf.CLEANUP_BATCH, conf.BUCKETS))
        for user_id, state in store.run(store.scan_recent(list(buckets), since)):
            if domain.live_status(state, now, timing) is not domain.Status.OFFLINE:
                live.append(user_id)
    presences = bulk_presence(live, viewer)
    return _most_recent_online(presences, None)


# --- choosing a status ----------------------------------------------------------------------


def _change(
    status: str,
    text: str | None,
    emoji: str | None,
    activity: str | None,
    expires_at: datetime | None,
) -> tuple[StatusChange, datetime | None]:
    expires_in: float | None = None
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise InvalidInput("invalid_value", "expires_at must be an aware datetime.")
        expires_in = (expires_at - timezone.now()).total_seconds()
        if expires_in < 1:
            raise InvalidInput("invalid_value", "expires_at must be in the future.")
    change = domain.parse_status_change(
        {
            "status": status,
            "text": text,
            "emoji": emoji,
            "activity": activity,
            "expires_in": expires_in,
        },
        rules.limits(),
    )
    return change, expires_at


def apply_change(user: Any, change: StatusChange, expires_at: datetime | None = None) -> Presence:
    """Store a validated status change and return the user's own presence."""
    if expires_at is None and change.expires_in is not None:
        expires_at = timezone.now() + timedelta(seconds=change.expires_in)
    has_custom = any((change.text, change.emoji, change.activity))
    with transaction.atomic():
        UserStatus.objects.update_or_create(
            user_id=_pk(user),
            defaults={
                "dnd": change.status is StatusChoice.DND,
                "text": change.text or "",
                "emoji": change.emoji or "",
                "activity": change.activity or "",
                "expires_at": expires_at if has_custom else None,
            },
        )
        # Without signals (a saved PrivacySettings announces "privacy"): this change's own
        # announcement below covers it, so viewers are told once.
        invisible = change.status is StatusChoice.INVISIBLE
        if not PrivacySettings.objects.filter(user_id=_pk(user)).update(invisible=invisible):
            PrivacySettings.objects.bulk_create(
                [PrivacySettings(user_id=_pk(user), invisible=invisible)], ignore_conflicts=True
            )
        transaction.on_commit(
            lambda: presence_changed.send(sender=UserStatus, user_id=_pk(user), reason="status")
        )
    # The live layer announces the custom status clearing by itself when it expires.
    store = get_store()
    store.run(
        store.schedule_expiry(
            _pk(user), expires_at.timestamp() if has_custom and expires_at else None
        )
    )
    return get_presence(user, user)


def set_status(
    user: Any,
    status: str,
    text: str | None = None,
    emoji: str | None = None,
    activity: str | None = None,
    expires_at: datetime | None = None,
) -> Presence:
    """Choose ``auto``, ``dnd`` or ``invisible`` and a custom status clearing at ``expires_at``.

    Raises :class:`InvalidInput` (a ``ValueError``) naming what is wrong; nothing is saved then.
    """
    change, expires_at = _change(status, text, emoji, activity, expires_at)
    return apply_change(user, change, expires_at)


async def aset_status(
    user: Any,
    status: str,
    text: str | None = None,
    emoji: str | None = None,
    activity: str | None = None,
    expires_at: datetime | None = None,
) -> Presence:
    return await sync_to_async(set_status)(user, status, text, emoji, activity, expires_at)


# --- contacts and blocks (a site's own graph) -------------------------------------------------


def _two_users(first: Any, second: Any, action: str) -> tuple[Any, Any]:
    first_pk, second_pk = _pk(first), _pk(second)
    if first_pk == second_pk:
        raise InvalidInput("invalid_value", f"A user cannot {action} themselves.")
    found = get_user_model()._default_manager.filter(pk__in=[first_pk, second_pk]).count()
    if found != 2:
        raise InvalidInput("unknown_users", f"No user has the id {first_pk} or {second_pk}.")
    return first_pk, second_pk


def follow(owner: Any, target: Any) -> bool:
    """``owner`` adds ``target`` to its contacts (follows it). True if that changed anything.

    Saves the row like the admin does, so open connections see the change after commit. With
    the default ``contacts`` visibility, ``target`` now sees ``owner`` online; two users who
    follow each other are friends (``online_friends``)."""
    owner_pk, target_pk = _two_users(owner, target, "follow")
    _, created = Contact.objects.get_or_create(owner_id=owner_pk, contact_id=target_pk)
    return created


def unfollow(owner: Any, target: Any) -> bool:
    """``owner`` removes ``target`` from its contacts (and close friends). True if it was one."""
    owner_pk, target_pk = _pk(owner), _pk(target)
    # A queryset delete sends post_delete for each row (presence listens to it).
    deleted, _ = Contact.objects.filter(owner_id=owner_pk, contact_id=target_pk).delete()
    return deleted > 0


def set_close_friend(owner: Any, target: Any, close_friend: bool = True) -> bool:
    """Mark (or unmark) ``target`` as one of ``owner``'s close friends, following it if needed.
    True if that changed anything."""
    owner_pk, target_pk = _two_users(owner, target, "befriend")
    contact, created = Contact.objects.get_or_create(
        owner_id=owner_pk, contact_id=target_pk, defaults={"close_friend": close_friend}
    )
    if created or contact.close_friend == close_friend:
        return created
    contact.close_friend = close_friend
    contact.save(update_fields=["close_friend"])
    return True


def block(blocker: Any, blocked: Any) -> bool:
    """``blocker`` blocks ``blocked``: each is hidden from the other (offline, no last seen, no
    custom status, no diffs). True if it was not blocked yet."""
    blocker_pk, blocked_pk = _two_users(blocker, blocked, "block")
    _, created = Block.objects.get_or_create(blocker_id=blocker_pk, blocked_id=blocked_pk)
    return created


def unblock(blocker: Any, blocked: Any) -> bool:
    """Lift ``blocker``'s block of ``blocked``. True if there was one."""
    deleted, _ = Block.objects.filter(blocker_id=_pk(blocker), blocked_id=_pk(blocked)).delete()
    return deleted > 0


async def afollow(owner: Any, target: Any) -> bool:
    return await sync_to_async(follow)(owner, target)


async def aunfollow(owner: Any, target: Any) -> bool:
    return await sync_to_async(unfollow)(owner, target)


async def aset_close_friend(owner: Any, target: Any, close_friend: bool = True) -> bool:
    return await sync_to_async(set_close_friend)(owner, target, close_friend)


async def ablock(blocker: Any, blocked: Any) -> bool:
    return await sync_to_async(block)(blocker, blocked)


async def aunblock(blocker: Any, blocked: Any) -> bool:
    return await sync_to_async(unblock)(blocker, blocked)


# --- writes the signals do not see ---------------------------------------------------------


def notify_changed(users: Iterable[Any], reason: str = "bulk") -> None:
    """Tell open connections that what others may see of ``users`` may have changed.

    Presence hears about changes to its models through ``post_save``/``post_delete``; a
    ``QuerySet.update()``, ``bulk_create``/``bulk_update``, a queryset ``delete()`` of rows
    without signals, or raw SQL sends none, so a site calls this after such a write (of
    PrivacySettings, Contact, Block or UserStatus rows). ``users`` are users or ids: every user
    whose presence others see differently (for a Contact, its owner; for a Block, both users).
    Sends :data:`presence.signals.presence_changed` with ``reason`` for each, after the current
    transaction commits (right away outside one), which pushes diffs to open WebSockets.
    """
    user_ids = _target_ids(users)

    def send() -> None:
        for user_id in user_ids:
            presence_changed.send(sender=None, user_id=user_id, reason=reason)

    if user_ids:
        transaction.on_commit(send)


async def anotify_changed(users: Iterable[Any], reason: str = "bulk") -> None:
    await sync_to_async(notify_changed)(list(users), reason)


# --- maintenance ----------------------------------------------------------------------------


@dataclass
class CleanupReport:
    buckets: int = 0
    stale: int = 0
    persisted: int = 0
    removed: int = 0
    expired_statuses: int = 0
    dry_run: bool = False


def cleanup(dry_run: bool = False, batch: int | None = None) -> CleanupReport:
    """Persist last seen of users no longer online, then remove them from Redis.

    Works through the buckets ``batch`` at a time (one round trip each), so no Redis command
    touches more than one small bucket. Idempotent and safe to run concurrently: an entry is
    removed only if unchanged since it was persisted. Raises StoreUnavailable if Redis is down.
    """
    conf = get_settings()
    store = get_store()
    batch = batch or conf.CLEANUP_BATCH
    now = rules.now()
    before = now - conf.ONLINE_WINDOW
    timing = rules.timing()
    report = CleanupReport(dry_run=dry_run)
    for start in range(0, conf.BUCKETS, batch):
        buckets = list(range(start, min(start + batch, conf.BUCKETS)))
        # The scan's bound catches every signed-off entry; the same rule as every read decides
        # which of those are still within OFFLINE_GRACE, so cleanup never cuts a grace short.
        entries = [
            entry
            for entry in store.run(store.scan_stale(buckets, before))
            if domain.live_status(entry.state, now, timing) is domain.Status.OFFLINE
        ]
        report.buckets += len(buckets)
        report.stale += len(entries)
        if dry_run or not entries:
            continue
        seen: dict[UserId, float] = {}
        for entry in entries:
            seen[entry.user_id] = max(seen.get(entry.user_id, 0.0), entry.seen_at)
        report.persisted += LastSeen.objects.record_many(seen)
        report.removed += store.run(store.remove_unchanged(entries))
    if not dry_run:
        store.run(store.prune_schedules(now - conf.ONLINE_WINDOW))
    expired = UserStatus.objects.filter(expires_at__lte=timezone.now())
    if dry_run:
        report.expired_statuses = expired.count()
    else:
        report.expired_statuses = expired.update(text="", emoji="", activity="", expires_at=None)
    return report
