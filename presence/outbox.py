"""Signals sent once per transition, even when the write's caller never got the reply.

The script that makes a transition also records it in an outbox (lua/outbox.lua): a user's
online or offline in its shard's (lua/ledger.lua), a user's entering or leaving a room in the
room's, in the room's slot (lua/room_common.lua). The caller told "this call made the user
online" (or offline, or entered or left the room) claims the entry (ZREM, on the receivers'
thread, right before its receivers run) and sends the signal only if it removed it. An entry
nobody claimed within :func:`deadline` (its caller gave up waiting for Redis, was killed, or
could not reach Redis to claim) is claimed by the next sweep anywhere (a room's: the sweep of
that room, which its outbox keeps due), or by ``presence_cleanup``, with one script that
removes what it returns. Removal is atomic, so exactly one party sends each transition. A
user's transition claimed so is announced too (:func:`claim_stale`): its caller, who never got
the reply, announced nothing.

A claim waits for a busy Redis as the write that made the transition did (a live path's
``LIVE_SOCKET_TIMEOUT``, :func:`run_live`): a claimer that gave up on a late reply would take
the entry for "not mine" while Redis still removes it. The windows left lose a signal, never
double one: a claimer killed between its claim and its receivers, and a claim whose reply
never comes back though Redis ran it (later than ``LIVE_SOCKET_TIMEOUT``, or its connection
lost on the way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar, cast

from presence import announce, copies, layer, signals
from presence.conf import get_settings
from presence.domain import LIVE_CHANGE
from presence.operations import Operation, call
from presence.store import Plan, get_store, merge
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
    if any(isinstance(each, Transition) and each.guessed for each in transitions):
        # The store met a shard whose copy of the users' choices Redis lost (lua/ledger.lua),
        # whether or not the write made a transition: seeded from the database at once, by a
        # thread of this process.
        copies.seed_soon()
    made = [
        (transition, signal)
        for transition in transitions
        for signal in (
            [transition] if isinstance(transition, RoomTransition) else _user_signals(transition)
        )
    ]
    claims = _user_claims(store, made)
    # a room's entry per claim: a sweep's batch of leaves shares one, claimed once for all
    room_claims: dict[tuple[str, str], Callable[[], bool]] = {}
    for position, (transition, signal) in enumerate(made):
        if isinstance(transition, RoomTransition):
            room, entry = transition.room, transition.entry
            if entry is not None and (room, entry) not in room_claims:
                room_claims[room, entry] = _once(
                    partial(run_live, store.plans.claim_room_entry(room, entry))
                )
            signals.send_room_transition(
                transition.user_id,
                room,
                transition.made,
                transition.at,
                None if entry is None else room_claims[room, entry],
            )
            continue
        kind, at, entry = cast(_UserSignal, signal)
        # A choice the store guessed (its copy lost, not seeded yet) is the database's to tell.
        invisible: signals.Invisible = (
            partial(copies.chose_invisible, transition.user_id)
            if transition.guessed
            else transition.invisible
        )
        if entry is None:
            signals.send_transition(transition.user_id, kind, at, invisible)
        else:
            signals.send_if_claimed(claims[position], transition.user_id, kind, at, invisible)


#: a user's transition to send: made (1 online, -1 offline), at, its outbox entry (None:
#: claimed already)
_UserSignal = tuple[int, float, str | None]


def _user_signals(transition: Transition) -> list[_UserSignal]:
    """The signals a user's transition earned, in order: the offline the write made first (the
    user was still in the ledger past their time), then its own."""
    if not transition.made or transition.at is None:
        return []
    own = (transition.made, transition.at, transition.entry)
    if transition.ended_at is None:
        return [own]
    return [(-1, transition.ended_at, transition.ended_entry), own]


def _user_claims(
    store: Any, made: list[tuple[Transition | RoomTransition, Any]]
) -> dict[int, Callable[[], bool]]:
    """The claim of each user signal's outbox entry, by its position in ``made`` (pairs of a
    transition and what it sends; a room's are left alone): on the receivers' thread, the first
    one run claims them all in one round trip (a sweep's users turning offline together), and
    each answers for its own entry (an entry listed twice is won once)."""
    users = [
        (position, transition.user_id, signal[2])
        for position, (transition, signal) in enumerate(made)
        if isinstance(transition, Transition) and signal[2] is not None
    ]
    if not users:
        return {}
    plans = [store.plans.claim_entry(user_id, entry) for _, user_id, entry in users]
    if len(plans) == 1:
        return {users[0][0]: partial(run_live, plans[0])}
    together = _once(partial(run_live, merge(plans)))
    return {position: partial(_nth, together, n) for n, (position, _, _) in enumerate(users)}


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


def run_live(plan: Plan[T]) -> T:
    """``plan``'s result, from sync code (the receivers' thread, ``presence_cleanup``), run as
    the live paths run theirs (``store.arun(plan, live=True)``, on the process's loop for sync
    code): it waits for a busy Redis up to ``LIVE_SOCKET_TIMEOUT``, where the sync client gives
    up after ``SOCKET_TIMEOUT``. For the outboxes' claims, whose late reply must not be taken
    for "not mine" while Redis removes the entry all the same."""
    running = asyncio.run_coroutine_threadsafe(arun_live(plan), layer.sync_loop())
    return running.result()


async def arun_live(plan: Plan[T]) -> T:
    """:func:`run_live` on this event loop."""
    return await get_store().arun(plan, live=True)


def deadline() -> float:
    """How long an entry is left to its caller: LIVE_SOCKET_TIMEOUT (the longest a write waits
    for Redis), plus a second as entries are scored in whole seconds."""
    return outbox_deadline(get_settings())


def claim_stale(now: float) -> Operation[int]:
    """``yield from claim_stale(now)``: claim the entries left past the deadline, send their
    signals, and announce their users (the sweep, ``presence_cleanup``). Returns how many.

    An entry left unclaimed is a transition whose caller never learnt it made it (a page that
    gave up on a slow Redis that ran its write later, a process killed), so nobody announced
    it either: open sockets watching the user are told here, and the change stamped, as its
    caller would have. A user told twice (their offline also announced by this sweep) is
    resolved again and sent nothing new."""
    store = get_store()
    plan = store.plans.claim_stale_entries(now - deadline(), get_settings().SWEEP_BATCH)
    entries = yield from call(partial(run_live, plan), afunction=partial(arun_live, plan))
    if any(entry.guessed for entry in entries):
        copies.seed_soon()  # (as send_made: the store met a shard that lost its copy)
    for entry in entries:
        # A choice the store guessed is the database's to tell (as send_made).
        invisible: signals.Invisible = (
            partial(copies.chose_invisible, entry.user_id) if entry.guessed else entry.invisible
        )
        signals.send_transition(entry.user_id, entry.made, entry.at, invisible)
    if entries:
        yield from call(
            announce.announce_change,
            list(dict.fromkeys(entry.user_id for entry in entries)),
            LIVE_CHANGE,
            afunction=announce.aannounce_change,
        )
    return len(entries)
