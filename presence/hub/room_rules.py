"""Rooms' rules asked again for the members of this process's connections (docs/rooms.md):
at least once per HEARTBEAT_INTERVAL, and at once when ``recheck_room`` is announced.

A pass asks each (user, room) once, whatever the number of the user's connections in the
room here, all in one trip to the database's thread; kinds without a rule cost nothing. A
member refused is taken out of the room on each of their connections here (after a join or a
renewal under way is written), leaves it at once in Redis (no OFFLINE_GRACE, the room told:
every view drops them in its next window) and gets a ``forbidden`` error for the room; their
socket stays open. A periodic pass that refused someone has the other processes with
connections in the room ask for them at once too, so that the member leaves everywhere in the
same window, not at each process's next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from presence import announce
from presence.conf import get_settings
from presence.domain import UserId, passed
from presence.domain.rooms import parse_room
from presence.hub.registry import Registry
from presence.rooms.live import ConnectionRooms
from presence.rooms.rule import averdicts, needs_asking
from presence.rooms.writes import aleave_refused
from presence.users import encode_id

logger = logging.getLogger("presence")

#: how often (loop seconds) the periodic check looks whether its pass is due; the pass is due
#: by the wall clock, so that it follows time.time() as the rooms' stays do
RULES_TICK = 0.25


class RoomRules:
    """The rules' passes over this process's room connections."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        #: wall-clock time of the last periodic pass (or of the start)
        self.checked_at = 0.0
        #: passes asked for by recheck_room, under way
        self.asked: set[asyncio.Task[None]] = set()

    def requested(self, room: str, users: Collection[UserId] | None) -> None:
        """``recheck_room`` reached this process: a pass for that room (those users), in a task
        of its own (never on the receive loop: it waits for the database's thread)."""
        if room not in self.registry.rooms.members:
            return
        task = asyncio.ensure_future(self._logged(self.recheck([room], users)))
        self.asked.add(task)
        task.add_done_callback(self.asked.discard)

    async def run(self, running: Callable[[], bool]) -> None:
        """A pass over every room here at least once per HEARTBEAT_INTERVAL, while
        ``running()``."""
        self.checked_at = time.time()
        while running():
            await asyncio.sleep(RULES_TICK)
            now = time.time()
            # (a clock stepped back takes the pass now, not the step's length late)
            if not passed(now, self.checked_at, self._period()) or not running():
                continue
            self.checked_at = now
            await self.check_all()

    async def check_all(self) -> None:
        """A pass over every room here (the others told of whom it refused); a failure (the
        database's) is logged, and the next pass asks again."""
        await self._logged(self.recheck(tell_others=True))

    @staticmethod
    def _period() -> float:
        # Looked at every RULES_TICK: due that much early, so no pass is later than the interval.
        return max(get_settings().HEARTBEAT_INTERVAL - RULES_TICK, RULES_TICK)

    async def _logged(self, pass_: Any) -> None:
        try:
            await pass_
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Presence: asking rooms' rules again failed")

    async def recheck(
        self,
        rooms: Collection[str] | None = None,
        users: Collection[UserId] | None = None,
        tell_others: bool = False,
    ) -> int:
        """Ask the rules again for the members here of ``rooms`` (all: None) among ``users``
        (all: None); take the refused ones out. How many (user, room) were refused."""
        memberships = self.registry.rooms
        names = list(memberships.members) if rooms is None else list(rooms)
        wanted = None if users is None else set(users)
        pairs: dict[tuple[UserId, str], list[ConnectionRooms]] = {}
        for name in names:
            if not needs_asking(parse_room(name)):
                continue
            for connection in memberships.members.get(name, ()):
                if wanted is not None and connection.viewer_id not in wanted:
                    continue
                joined = memberships.joined.get(connection)
                if joined is None:
                    continue  # never joined a room (the hub's tests' stand-ins)
                pairs.setdefault((connection.viewer_id, name), []).append(joined)
        if not pairs:
            return 0
        asked = list(pairs)
        allowed = await averdicts(
            [(pairs[key][0].connection.user, parse_room(key[1])) for key in asked]
        )
        refused = [key for key, ok in zip(asked, allowed, strict=True) if not ok]
        if refused:
            await self._take_out({key: pairs[key] for key in refused})
            if tell_others:
                await self._tell_others(refused)
        return len(refused)

    async def _take_out(self, refused: dict[tuple[UserId, str], list[ConnectionRooms]]) -> None:
        """Refused members out of their rooms on each of their connections here: rooms and
        views first (no diff of the room reaches them from now on), then one write for every
        leave."""
        out: list[tuple[ConnectionRooms, UserId, str]] = []
        for (user_id, name), joined in refused.items():
            dropped = await asyncio.gather(*(rooms.drop_room(name) for rooms in joined))
            out.extend(
                (rooms, user_id, name)
                for rooms, was_in in zip(joined, dropped, strict=True)
                if was_in
            )
        await aleave_refused((uid, r.connection.connection_id, name) for r, uid, name in out)
        for rooms, _, name in out:
            try:
                await rooms.tell_refused(name)
            except Exception:  # a connection closing must not stop the others
                logger.debug("Presence: could not tell a refused room member", exc_info=True)

    async def _tell_others(self, refused: list[tuple[UserId, str]]) -> None:
        """The other processes with connections in these rooms ask for these users now."""
        by_room: dict[str, list[int | str]] = {}
        for user_id, name in refused:
            by_room.setdefault(name, []).append(encode_id(user_id))
        for name, ids in by_room.items():
            await announce.aannounce_room_recheck(name, ids)
