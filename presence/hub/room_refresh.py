"""Fresh ``room_state`` frames for room views that may have missed announcements (after an
outage of presence's Redis, a failed channel-layer call, or a catch-up of a process that fell
behind its channel: presence.hub.rooms.RoomViews.sweep)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from presence.domain.rooms import RoomState, parse_room
from presence.hub import sends
from presence.hub.registry import Connection, View
from presence.rooms.cards import add_cards
from presence.rooms.reading import aread_room_state

logger = logging.getLogger("presence")


class Views(Protocol):
    def view_of(self, connection: Connection, room: str) -> View | None: ...

    def show(self, connection: Connection, room: str, state: RoomState) -> None: ...


async def refresh_views(
    views: Views, wanted: Iterable[tuple[Connection, str]], sending: sends.InOrder
) -> set[tuple[Connection, str]]:
    """Send each of these views still here a fresh room_state (it replaces what the client
    shows) through ``sending`` (the hub's: after the connection's frames asked before, before
    the room_diffs made from it, and a client that reads nothing holds up no other view's);
    the views Redis could not read in full, which keep what they show meanwhile."""
    failed: set[tuple[Connection, str]] = set()
    for connection, room in wanted:
        view = views.view_of(connection, room)
        if view is None:
            continue
        view.reading = True
        view.generation += 1
        # A join again during the read bumps the same view's generation and reads it anew:
        # that newer read is what the view shows and is sent, not this one.
        generation = view.generation
        try:
            # Strict: a read Redis could not answer in full (slow, down) would show the room
            # empty or its members offline.
            state = await aread_room_state(
                parse_room(room), connection.user, strict=True, live=True
            )
            frame = {"type": "room_state", **state.as_dict()}
            await add_cards([frame["members"]])
            if views.view_of(connection, room) is not view or view.generation != generation:
                continue  # it left the room, or joined it again (read anew), meanwhile
            views.show(connection, room, state)
            await sending.send(
                [connection],
                _current(views, room, view, generation, frame),
                "a refreshed room state",
            )
        except Exception as error:
            if view.generation == generation:  # not while a newer read of the view runs
                view.reading = False
            failed.add((connection, room))
            logger.warning("Presence: refreshing a room view failed (%s)", error)
    return failed


def _current(
    views: Views, room: str, view: View, generation: int, frame: dict[str, Any]
) -> Callable[[Connection], Awaitable[None]]:
    """The send of ``frame`` (the read of the view's ``generation``), looked at again when it
    goes (it may have waited behind a held send): not after a leave, nor after a newer
    room_state (a join again's, which goes apart from the hub's queue; a later refresh's)."""

    async def send(connection: Connection) -> None:
        if (
            views.view_of(connection, room) is view
            and view.generation == generation
            and not view.reading
        ):
            await connection.send_json(frame)

    return send
