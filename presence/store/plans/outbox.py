"""Outboxes (lua/outbox.lua): each transition a script made, until one party claims its entry
and sends its signal (presence.outbox). A shard's outbox holds its users' user_online and
user_offline (lua/ledger.lua), a room's its room_entered and room_left (lua/room_common.lua).
No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from presence.store.plans.plan import Plan
from presence.users import UserId

__all__ = ["OutboxEntry", "claim", "outbox_deadline", "parse_entry"]


def outbox_deadline(conf: Any) -> float:
    """How long an outbox entry is left to its caller before a sweep may claim it:
    LIVE_SOCKET_TIMEOUT (the longest a write waits for Redis), plus a second as entries are
    scored in whole seconds."""
    return float(conf.LIVE_SOCKET_TIMEOUT) + 1


def claim(outbox: str, entry: str) -> Plan[bool]:
    """Claims an outbox entry (lua/outbox.lua): True for exactly one claimer (the caller that
    made it, or a sweep), who sends its signal. False when Redis fails: a sweep claims it
    after its deadline if Redis never ran it; if Redis ran it and its reply was lost, the
    signal is lost (run it as the live paths do: presence.outbox.run_live)."""
    return Plan(
        commands=[("ZREM", outbox, entry)],
        parse=lambda replies: int(replies[0]) == 1,
        fallback=False,
    )


@dataclass(frozen=True)
class OutboxEntry:
    """A transition of an outbox (lua/outbox.lua) claimed by a sweep."""

    user_id: UserId
    made: int
    invisible: bool
    at: float
    #: the store could not tell the choice (its copy lost, not seeded again yet: lua/ledger.lua
    #: records it "2"): ``invisible`` is its guess, the database's to tell
    guessed: bool = False


def parse_entry(entry: Any, decode: Any) -> OutboxEntry:
    """``made|invisible|at|redis time|uid`` (the uid last: it may hold anything; invisible 0, 1
    or 2, a guess). A room's sweep's batch (``at`` "*") is parsed with its room (plans.rooms
    ``_transitions``)."""
    text = entry.decode() if isinstance(entry, bytes) else str(entry)
    made, invisible, at, _, uid = text.split("|", 4)
    return OutboxEntry(decode(uid), int(made), invisible != "0", float(at), invisible == "2")
