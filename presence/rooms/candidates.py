"""What one read of a room learns of its candidates (the members it may list): their privacy
facts and live state, read once each however far down the room the read goes, in pieces.

A viewer who may see few of a big room's members makes the read go down to 32 x
ROOM_LIST_LIMIT of them (presence.rooms.reading): each pass reads the first members again, four
times as many, but no candidate's facts or live state are read twice, and they are read
CHUNK at a time, so that other users' reads take their turns meanwhile on the database's
thread (which takes calls in order) and Redis, instead of waiting behind all of it. How many
were read is what a socket's join is charged (presence.consumers.limits.join_cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from presence import relations
from presence.domain import LiveState, Presence, UserId
from presence.operations import Call, Operation, Redis, both
from presence.store import get_store

#: candidates whose facts and live state are read in one trip (a first read of a room,
#: 2 x ROOM_LIST_LIMIT of them at the default, is one)
CHUNK = 256


@dataclass
class Resolved:
    """The candidates' facts, live state and presences as the viewer sees them, so far."""

    facts: relations.Facts
    live: dict[UserId, LiveState]
    #: the members whose facts were read (or given: the viewer's own)
    asked: set[UserId]
    presences: dict[UserId, Presence] = field(default_factory=dict)
    #: how many members' facts and live state were read
    read: int = 0
    #: some candidates' live state could not be read (Redis slow or down): they read offline,
    #: which a strict read (a join, a page, the JSON endpoint) must not show as the room
    live_unread: bool = False

    @classmethod
    def of(cls, own: relations.Facts, own_live: dict[UserId, LiveState] | None = None) -> Resolved:
        """Starting from the viewer's own facts and live state, when read already."""
        return cls(dict(own), dict(own_live or {}), set(own))


def read_candidates(
    viewer: Any, unread: Sequence[UserId], resolved: Resolved, waits: bool
) -> Operation[None]:
    """Read the facts and live state of ``unread`` into ``resolved``, CHUNK at a time: the same
    reads as a subscribe's snapshot (the compiled facts query, and the live state in one script:
    read_recent since 0 leaves nobody out), each chunk's two at once."""
    store = get_store()
    for start in range(0, len(unread), CHUNK):
        chunk = list(unread[start : start + CHUNK])
        facts, live = yield from both(
            Call(relations.load, (viewer, chunk), relations.aload),
            Redis(store.plans.read_recent(chunk, 0), waits),
        )
        resolved.facts.update(facts)
        if live is None:
            resolved.live_unread = True
        resolved.live.update(live or {})
        resolved.asked.update(chunk)
        resolved.read += len(chunk)
