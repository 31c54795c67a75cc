"""The one privacy resolver and the liveness rules it builds on: who may see what
(:func:`permits`), online/idle/offline from activity (:func:`live_status`), and what a viewer is
shown (:func:`resolve`). Every read path hands the store's facts and the relations to
:func:`resolve`."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache

from presence.domain.model import (
    EXCEPTION_ALLOW,
    EXCEPTION_DENY,
    EXCEPTION_SHIFT,
    HIDDEN,
    Choices,
    Device,
    LastSeenApprox,
    LiveState,
    Presence,
    Relation,
    Status,
    Timing,
    Visibility,
)
from presence.memo import bounded_memo


def visibly_differs(before: Presence | None, after: Presence) -> bool:
    """Whether a viewer who was shown ``before`` must be told ``after``.

    While a user stays online their last seen is "about now" and moves with every heartbeat;
    that alone is no news, so it is compared only when the user is (or goes) offline; whether
    it is shown at all is news at any time.
    """
    if before is None or before is after:
        return before is None
    if before.is_online and after.is_online:
        # Every field but last_seen (without building two copies: the hub asks this per viewer).
        return (
            before.status,
            before.devices,
            before.text,
            before.emoji,
            before.activity,
            before.invisible,
            before.last_seen_approx,
            before.last_seen is None,
            before.expires_at,
        ) != (
            after.status,
            after.devices,
            after.text,
            after.emoji,
            after.activity,
            after.invisible,
            after.last_seen_approx,
            after.last_seen is None,
            after.expires_at,
        )
    return before != after


def permits(level: Visibility, relation: Relation, setting: str | None = None) -> bool:
    """Whether ``relation``'s viewer may see a field at ``level``. With ``setting`` (one of
    VISIBILITY_SETTINGS), the target's exceptions for that setting apply: "never share" and
    "always share" beat the level; a block beats both (self sees everything)."""
    if relation.is_self:
        return True
    if relation.blocked:
        return False
    if setting is not None and relation.exceptions:
        exception = relation.exceptions >> EXCEPTION_SHIFT[setting]
        if exception & EXCEPTION_DENY:
            return False
        if exception & EXCEPTION_ALLOW:
            return True
    if level is Visibility.EVERYONE:
        return True
    if level is Visibility.CONTACTS:
        return relation.is_contact
    if level is Visibility.CLOSE_FRIENDS:
        return relation.is_contact and relation.is_close_friend
    return False


#: Redis keeps whole seconds (``int(now)``), so an event is known only to its second. The grace
#: and the TTL count from the END of that second, so neither is ever cut short (a close at
#: 100.9 is offline at 101 + grace, not at 100 + grace); page views' ONLINE_WINDOW, long and
#: not a promise to the second, counts from its start (docs/settings.md).
SECOND = 1


def offline_at(live: LiveState, timing: Timing) -> float | None:
    """When the user turns offline if nothing else happens (None: never online)."""
    if live.last_active is None:
        return None
    if live.signed_off:
        return live.last_active + SECOND + timing.offline_grace
    if live.connected:
        return live.last_active + SECOND + timing.connection_ttl
    return live.last_active + timing.online_window


def live_status(live: LiveState, now: float, timing: Timing) -> Status:
    """Online, idle or offline from activity and connections (dnd is a choice, see resolve)."""
    deadline = offline_at(live, timing)
    if deadline is None or now >= deadline:
        return Status.OFFLINE
    return Status.IDLE if live.idle else Status.ONLINE


def live_news(
    before: LiveState, after: LiveState, now: float, timing: Timing, until: float | None = None
) -> bool:
    """Whether a write changed the user's status or devices, as opposed to only moving their
    last activity forward (a heartbeat that changes nothing is no news).

    ``now`` is when the write was made, ``until`` (if later) when it was known done: a reader
    in between may have seen ``before`` turn offline (a heartbeat that came just after the
    connection's TTL), and nobody else tells that reader the user is back. A difference at
    either instant is news."""

    def view(state: LiveState, at: float) -> tuple[Status, tuple[Device, ...]]:
        status = live_status(state, at, timing)
        return status, (state.devices if status is not Status.OFFLINE else ())

    if view(before, now) != view(after, now):
        return True
    return until is not None and until > now and view(before, until) != view(after, until)


def _timestamp(value: float | None) -> datetime | None:
    return _datetime_at(value) if value is not None else None


# Last-active times are whole seconds, shared by many users read at once (datetimes are
# immutable: one instance serves them all).
@bounded_memo(8192)
def _datetime_at(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


@cache
def _device_names(devices: tuple[Device, ...]) -> tuple[str, ...]:
    # A handful of distinct tuples: resolving thousands of users builds none.
    return tuple(device.value for device in devices)


def shows_last_seen(choices: Choices, relation: Relation) -> bool:
    """Whether ``relation``'s viewer may see the target's exact last seen, by the target's
    choices alone (reciprocity aside): never across a block nor of an invisible user, and
    only where online status is shown too (a fresh last seen would reveal "online")."""
    if relation.is_self:
        return True
    return (
        not relation.blocked
        and not choices.invisible
        and permits(choices.online_visibility, relation, "online_visibility")
        and permits(choices.last_seen_visibility, relation, "last_seen_visibility")
    )


#: seconds in a UTC day (epoch seconds count no leap seconds: days are whole multiples)
DAY = 86_400


def approximate(last_seen: float, now: float) -> LastSeenApprox:
    """How long ago ``last_seen`` was, in whole UTC days between its day and today's: 0-2
    recently, 3-6 within a week, 7-29 within a month, 30+ a long time ago. A function of the
    two days only, so it moves at UTC midnight as days pass, never within a day."""
    days = int(now // DAY) - int(last_seen // DAY)
    if days < 3:
        return LastSeenApprox.RECENTLY
    if days < 7:
        return LastSeenApprox.WITHIN_WEEK
    if days < 30:
        return LastSeenApprox.WITHIN_MONTH
    return LastSeenApprox.LONG_AGO


def approximate_before_today(
    last_seen: float | None, prior: float | None, now: float
) -> LastSeenApprox | None:
    """The approximate last seen a viewer who may not see the exact one is shown: counted from
    the latest last seen of a UTC day before today (``last_seen`` if it is of an earlier day,
    else ``prior``, the latest known before it), so activity of today counts only from the next
    midnight and the bucket changes only at UTC midnight: watching it never tells when a user
    came back. None where nothing before today is known (a first visit, today)."""
    return approximate_from((last_seen, prior), now)


def approximate_from(known: tuple[float | None, ...], now: float) -> LastSeenApprox | None:
    """:func:`approximate` of the latest of the ``known`` last seen times whose UTC day is
    before today (None where none is). Every time known counts, wherever it was kept (Redis's
    last seen and prior, the database's last seen and the one it replaced on an earlier day),
    and a write of today adds none of them: what a stranger is shown cannot change before
    midnight, whatever is written today (a sign-off, the sweep, ``presence_cleanup``)."""
    midnight = (now // DAY) * DAY
    latest = None
    for seen in known:
        if seen is not None and seen < midnight and (latest is None or seen > latest):
            latest = seen
    return approximate(latest, now) if latest is not None else None


def carry_last_seen(
    seen: float | None, prior: float | None, new: float
) -> tuple[float, float | None]:
    """The stored (last seen, prior) after recording ``new``: the last seen never moves
    backwards, and the prior is the latest known of a UTC day before the last seen's day. A
    write that moves the last seen into a later day keeps the one it replaces as the prior; a
    late write of an earlier day may raise the prior. The database's rule (LastSeen.record_many,
    whose SQL does the same) and Redis's (lua/prior.lua)."""
    if seen is None:
        return new, None
    if new // DAY > seen // DAY:
        return new, seen
    if new // DAY < seen // DAY:
        return seen, new if prior is None or new > prior else prior
    return max(seen, new), prior


def resolve(
    live: LiveState, choices: Choices, relation: Relation, now: float, timing: Timing
) -> Presence:
    """What ``relation``'s viewer may see of a target. The one privacy resolver.

    On the path of every read, thousands of users at a time (``online_friends``): it builds
    one Presence and nothing else."""
    if relation.blocked and not relation.is_self:
        return HIDDEN

    true_status = live_status(live, now, timing)
    if true_status is not Status.OFFLINE and choices.dnd:
        true_status = Status.DND
    last_seen_ts = live.last_active
    persisted = choices.persisted_last_seen
    if persisted is not None and (last_seen_ts is None or persisted > last_seen_ts):
        last_seen_ts = persisted
    expires_at = choices.expires_at
    if (expires_at is None or expires_at > now) and permits(
        choices.activity_visibility, relation, "activity_visibility"
    ):
        text, emoji, activity = choices.text, choices.emoji, choices.activity
    else:
        text = emoji = activity = None
    if relation.is_self:
        online = true_status is not Status.OFFLINE
        # When the custom status the user sees clears: their status menu keeps it.
        clears = None
        if expires_at is not None and (text or emoji or activity):
            clears = datetime.fromtimestamp(expires_at, tz=UTC)
        return Presence(
            status=true_status,
            last_seen=_timestamp(last_seen_ts),
            devices=_device_names(live.devices) if online else (),
            text=text,
            emoji=emoji,
            activity=activity,
            invisible=choices.invisible,
            expires_at=clears,
        )

    # Invisible looks exactly like offline with last seen hidden; it beats an "always share".
    show_online = not choices.invisible and permits(
        choices.online_visibility, relation, "online_visibility"
    )
    # A fresh last seen would reveal being online, so it needs both permissions; and with
    # RECIPROCAL_LAST_SEEN a viewer who hides their own sees only the approximate.
    show_last_seen = (
        show_online
        and not relation.hides_own_last_seen
        and permits(choices.last_seen_visibility, relation, "last_seen_visibility")
    )
    status = true_status if show_online else Status.OFFLINE
    approx = None
    if not show_last_seen and last_seen_ts is not None and timing.approximate_last_seen:
        # Counted from the latest last seen of a day before today, wherever it is kept.
        approx = approximate_from(
            (live.last_active, live.prior, persisted, choices.persisted_prior), now
        )
    return Presence(
        status=status,
        last_seen=_timestamp(last_seen_ts) if show_last_seen else None,
        devices=_device_names(live.devices) if status is not Status.OFFLINE else (),
        text=text,
        emoji=emoji,
        activity=activity,
        last_seen_approx=approx,
    )
