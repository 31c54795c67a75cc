"""Signals sent once per transition, even when the write's caller never got the reply.

The script that makes a transition also records it in its shard's outbox (lua/ledger.lua). The
caller told "this call made the user online" (or offline) claims the entry (ZREM, on the
receivers' thread, right before its receivers run) and sends the signal only if it removed it.
An entry nobody claimed within :func:`deadline` (its caller gave up waiting for Redis, was
killed, or could not reach Redis to claim) is claimed by the next sweep anywhere, or by
``presence_cleanup``, with one script that removes what it returns. Removal is atomic, so
exactly one party sends each transition; the one window left is a claimer killed between its
claim and its receivers (the signal is lost, never doubled).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from presence import signals
from presence.conf import get_settings
from presence.operations import Operation, redis
from presence.store import get_store


def send_made(result: Any) -> None:
    """Send the signals a store write earned (``redis_then``'s ``then``): ``result`` is a
    transition, None, or a list of them. Each is sent once its outbox entry is claimed here."""
    store = get_store()
    for transition in result if isinstance(result, list) else [result]:
        if transition is None or not transition.made or transition.at is None:
            continue
        if transition.entry is None:
            signals.send_transition(
                transition.user_id, transition.made, transition.at, transition.invisible
            )
            continue
        signals.send_if_claimed(
            partial(store.run, store.plans.claim_entry(transition.user_id, transition.entry)),
            transition.user_id,
            transition.made,
            transition.at,
            transition.invisible,
        )


def deadline() -> float:
    """How long an entry is left to its caller: LIVE_SOCKET_TIMEOUT (the longest a write waits
    for Redis), plus a second as entries are scored in whole seconds."""
    return get_settings().LIVE_SOCKET_TIMEOUT + 1


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
