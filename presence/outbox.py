"""Signals sent once per transition, even when the write's caller never got the reply.

The script that makes a transition also records it in an outbox (lua/outbox.lua): a user's
online or offline in its shard's (lua/ledger.lua), a user's entering or leaving a room in the
room's, in the room's slot (lua/room_common.lua). The caller told "this call made the user
online" (or offline, or entered or left the room) claims the entry (ZREM, on the receivers'
thread, right before its receivers run) and sends the signal only if it removed it. An entry
nobody claimed within :func:`deadline` (its caller gave up waiting for Redis, was killed, or
could not reach Redis to claim) is claimed by the next sweep anywhere (a room's: the sweep of
that room, which its outbox keeps due), or by ``presence_cleanup``, with one script that
removes what it returns. Removal is atomic, so exactly one party sends each transition; the
one window left is a claimer killed between its claim and its receivers (the signal is lost,
never doubled).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar, cast

from presence import signals
from presence.conf import get_settings
from presence.operations import Operation, redis
from presence.store import get_store, merge
from presence.store.plans import Pruned, RoomTransition, RoomWrite, Transition
from presence.store.plans.outbox import outbox_deadline

T = TypeVar("T")


def send_made(result: Any) -> None:
    """Send the signals a store write earned (``redis_then``'s ``then``): ``result`` is a
    transition (a user's, :class:`Transition`, or a room's, :class:`RoomTransition`), a
    room write or sweep carrying some, None, or a list of them (a merged plan's replies, where
    other replies are left alone). Each is sent once its outbox entry is claimed here; the
    entries of several users' transitions (a sweep's) are claimed together, in one round trip."""
    store = get_store()
    transitions = list(_transitions(result))
    claims = _user_claims(store, transitions)
    # a room's entry per claim: a sweep's batch of leaves shares one, claimed once for all
    room_claims: dict[tuple[str, str], Callable[[], bool]] = {}
    for position, transition in enumerate(transitions):
        if isinstance(transition, RoomTransition):
            room, entry = transition.room, transition.entry
            if entry is not None and (room, entry) not in room_claims:
                room_claims[room, entry] = _once(
                    partial(store.run, store.plans.claim_room_entry(room, entry))
                )
            signals.send_room_transition(
                transition.user_id,
                room,
                transition.made,
                transition.at,
                None if entry is None else room_claims[room, entry],
            )
        elif not transition.made or transition.at is None:
            continue
        elif transition.entry is None:
            signals.send_transition(
                transition.user_id, transition.made, transition.at, transition.invisible
            )
        else:
            signals.send_if_claimed(
                claims[position],
                transition.user_id,
                transition.made,
                transition.at,
                transition.invisible,
            )


def _user_claims(
    store: Any, transitions: list[Transition | RoomTransition]
) -> dict[int, Callable[[], bool]]:
    """The claim of each user transition's outbox entry, by its position in ``transitions``:
    on the receivers' thread, the first one run claims them all in one round trip (a sweep's
    users turning offline together), and each answers for its own entry (an entry listed
    twice is won once)."""
    made = [
        (position, t)
        for position, t in enumerate(transitions)
        if isinstance(t, Transition) and t.made and t.at is not None and t.entry is not None
    ]
    if not made:
        return {}
    plans = [store.plans.claim_entry(t.user_id, t.entry) for _, t in made]
    if len(plans) == 1:
        return {made[0][0]: partial(store.run, plans[0])}
    together = _once(partial(store.run, merge(plans)))
    return {position: partial(_nth, together, n) for n, (position, _) in enumerate(made)}


def _nth(claims: Callable[[], list[bool]], n: int) -> bool:
    return bool(claims()[n])


def _once(claim: Callable[[], T]) -> Callable[[], T]:
    """``claim`` run on the first call only; every call answers as it did (raising if it
    raised: then none of the batch is sent here, and its entry, if still there, is the
    sweep's). The receivers' one thread calls it, so no lock."""
    outcome: list[Any] = []

    def claimed() -> T:
        if not outcome:
            try:
                outcome.append((claim(), None))
            except Exception as failure:
                outcome.append((None, failure))
        won, failed = outcome[0]
        if failed is not None:
            raise failed
        return cast(T, won)

    return claimed


def _transitions(result: Any) -> Iterator[Transition | RoomTransition]:
    if isinstance(result, Transition | RoomTransition):
        yield result
    elif isinstance(result, RoomWrite | Pruned):
        yield from result.made
    elif isinstance(result, list):
        for each in result:
            yield from _transitions(each)


def deadline() -> float:
    """How long an entry is left to its caller: LIVE_SOCKET_TIMEOUT (the longest a write waits
    for Redis), plus a second as entries are scored in whole seconds."""
    return outbox_deadline(get_settings())


def claim_stale(now: float) -> Operation[int]:
    """``yield from claim_stale(now)``: claim the entries left past the deadline and send their
    signals (the sweep). Returns how many."""
    store = get_store()
    entries = yield from redis(
        store.plans.claim_stale_entries(now - deadline(), get_settings().SWEEP_BATCH), live=True
    )
    for entry in entries:
        signals.send_transition(entry.user_id, entry.made, entry.at, entry.invisible)
    return len(entries)
