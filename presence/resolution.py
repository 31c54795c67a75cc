"""Resolution: turning the store's replies into presence as viewers may see it.

The clock every write and read is judged by, the settings the domain's rules take (timing,
input limits), whether a write is news to announce, and the one resolver applied to what was
read (pure functions over their inputs). Used by :mod:`presence.api`, :mod:`presence.lifecycle`
and the endpoints; the rules themselves are :mod:`presence.domain`'s.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from presence import domain
from presence.conf import get_settings
from presence.domain import Presence, UserId
from presence.relations import Facts
from presence.store import Transition


def now() -> float:
    return time.time()


def timing() -> domain.Timing:
    conf = get_settings()
    return domain.Timing(
        online_window=conf.ONLINE_WINDOW,
        offline_grace=conf.OFFLINE_GRACE,
        connection_ttl=conf.CONNECTION_TTL,
        approximate_last_seen=conf.APPROXIMATE_LAST_SEEN is True,
    )


def limits() -> domain.Limits:
    """The input limits of frames and status changes, from the settings."""
    conf = get_settings()
    return domain.Limits(
        text_max_length=conf.TEXT_MAX_LENGTH,
        emoji_max_length=conf.EMOJI_MAX_LENGTH,
        max_expiry=conf.MAX_STATUS_EXPIRY,
        max_frame_bytes=conf.MAX_FRAME_BYTES,
        max_subscriptions=conf.MAX_SUBSCRIPTIONS,
    )


def is_news(transition: Transition | None, at: float) -> bool:
    """Whether a write made at ``at``, and done now, changed what others may see (status or
    devices), so it is announced. Readers judge a state at the time they start reading it, so
    one who saw the user offline while the write was under way is told too.

    A write that dropped an unsettled crashed connection is news whatever it changed: the
    process that held it may have died between recording a change through it and announcing
    it (a killed server), and that change, already in ``before``, would otherwise never be told.
    A crashed connection whose last write was no news (a heartbeat) is settled: its process
    lived past its earlier announcements, and dropping it is news only if that changes what the
    user shows (a reconnect storm's thousands of dead connections are then no announcement
    and no change stamp each)."""
    if transition is None:
        return False
    return transition.unsettled > 0 or domain.live_news(
        transition.before, transition.after, at, timing(), until=now()
    )


def resolve_all(
    facts: Facts, live: dict[UserId, domain.LiveState] | None, at: float
) -> dict[UserId, Presence]:
    """Each target of ``facts`` as its viewer may see it (the one resolver)."""
    return resolve_each(facts.items(), live, at)


def resolve_each(
    facts: Iterable[tuple[UserId, tuple[domain.Relation, domain.Choices]]],
    live: dict[UserId, domain.LiveState] | None,
    at: float,
) -> dict[UserId, Presence]:
    """:func:`resolve_all` of facts given one at a time (each may be dropped once resolved).

    Users active in the same second share their live state, and users of no choices of their
    own (most of a room) share their choices and relation (one object each: decode_score,
    presence.relations.facts), so each distinct (live state, choices, relation) is resolved
    once. Found by identity (hashing them cost more than resolving); the memo holds what it
    was given, so no identity is reused while it lives."""
    states = live or {}
    rules_timing = timing()
    unknown = domain.LiveState()
    resolved: dict[tuple[int, int, int], tuple[Presence, object]] = {}
    found = {}
    for user_id, (relation, choices) in facts:
        state = states.get(user_id, unknown)
        key = (id(state), id(choices), id(relation))
        known = resolved.get(key)
        if known is None:
            presence = domain.resolve(state, choices, relation, at, rules_timing)
            known = resolved[key] = (presence, (state, choices, relation))
        found[user_id] = known[0]
    return found


def unique(ids: Iterable[UserId]) -> list[UserId]:
    return list(dict.fromkeys(ids))
