"""Rooms' counts, live, for connections that watch them without joining (``watch_room_count``:
an index page's "3 here" beside each listing, docs/rooms.md).

A watcher is not a member: it is not listed, not counted, takes no MAX_ROOMS place and enters
no room (no ``room_entered``). While a connection here watches a room, the process is in the
room's channel-layer group (as for its members: presence.hub.registry.Registry.needs_room) and
in the group every process with room views is in (privacy changes). A room's changes are
counted at the first tick after them of the process's grid (presence.hub.room_windows), so a
room is counted at most once per window: one trip to the database's thread (its watchers'
blocks) and one Redis round trip for every room due at once
(presence.rooms.counts.acounts_for_viewers), no member listed and no member's facts read.
Each watcher is sent ``room_count`` only when its own count changed since what it was last
sent: a member it may not count (invisible, blocked either way) coming or going sends it
nothing, and its next count comes at no different time (the grid's ticks are the same
whoever changed). The rooms' rules are asked again for the watchers at least once per
HEARTBEAT_INTERVAL and on ``recheck_room``; a refused watcher stops watching and gets
``forbidden`` naming the room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext

from presence.announce import rooms_group_name
from presence.conf import get_settings
from presence.domain import InvalidInput, UserId, passed
from presence.domain.rooms import Room, parse_room
from presence.hub import sends
from presence.hub.groups import Groups
from presence.hub.registry import Connection, Registry
from presence.hub.room_windows import is_due, next_tick, tick_by
from presence.rooms.counts import acounts_for_viewers, awatched_count
from presence.rooms.rule import UnknownRoom, averdicts, needs_asking, room_rule

logger = logging.getLogger("presence")

#: how often (loop seconds) the loop looks whether the rules' pass is due (by the wall clock)
RULES_TICK = 0.25


@dataclass(slots=True)
class _Sent:
    """What a connection was last sent of a room's count (None: its first answer is on its
    way): compared by identity when a queued frame goes (a newer one replaced it)."""

    count: int | None


class RoomCounts:
    """The room counts watched by this process's connections, and their deliveries."""

    def __init__(self, registry: Registry, groups: Groups, sending: sends.InOrder) -> None:
        self.registry = registry
        self.groups = groups
        #: the hub's one queue of frames per connection (presence.hub.sends)
        self.sending = sending
        #: room -> the connections watching its count, and the other way round
        self.watching = registry.room_counts
        #: connection -> room -> what it was last sent
        self.sent: dict[Connection, dict[str, _Sent]] = {}
        #: room -> the tick it is counted at (loop time)
        self.pending: dict[str, float] = {}
        #: room -> the tick of its last count (the next one is a window after it at least)
        self.delivered_at: dict[str, float] = {}
        #: wall-clock time of the rules' last pass over the watchers
        self.checked_at = time.time()
        #: rules' passes asked by recheck_room, under way
        self.asked: set[asyncio.Task[None]] = set()
        #: windows delivered so far (tests count them)
        self.rounds = 0
        self._wake = asyncio.Event()

    # --- watching ---

    async def watch(self, connection: Connection, room: Room) -> None:
        """``watch_room_count``: send the room's count as the connection's user may see it now
        (``room_count``), then its changes. InvalidInput where the room is unknown or the bound
        of watched rooms is reached; ``forbidden`` where its rule refuses the user."""
        name = room.name
        watched = self.sent.get(connection, {})
        limit = get_settings().MAX_WATCHED_ROOMS
        if name not in watched and len(watched) >= limit:
            raise InvalidInput(
                "too_many_watched_rooms",
                gettext(
                    "A connection may watch the counts of at most %(limit)d rooms; "
                    "unwatch one first."
                )
                % {"limit": limit},
                room=name,
            )
        try:
            room_rule(room)
        except UnknownRoom as error:
            raise InvalidInput(error.code, error.message, room=name) from None
        if connection not in self.registry.connections:
            return  # detached meanwhile: nothing may be added for it
        # Taken before it counts as watched: whether the groups are joined for another
        # connection here (a member, another watcher) already.
        joins = self._joins_needed(name)
        mine = _Sent(None)
        self.sent.setdefault(connection, {})[name] = mine
        self.watching.add(connection, name)
        try:
            # In the room's group before the count is read: a change made after the read
            # reaches this process (and is counted again a window later).
            await asyncio.gather(*joins)
            count = await awatched_count(room, connection.user)
        except PermissionDenied:
            await self._stop(connection, name, mine, linger=False)
            await _tell(
                connection,
                "forbidden",
                gettext("You may not enter the room %(room)s.") % {"room": name},
                name,
            )
            return
        except BaseException:
            await asyncio.shield(self._stop(connection, name, mine, linger=False))
            raise
        if self.sent.get(connection, {}).get(name) is not mine:
            return  # unwatched (or watched again) meanwhile: that answer stands
        if count is None:
            await self._stop(connection, name, mine, linger=False)
            await _tell(
                connection,
                "unavailable",
                gettext("The room %(room)s cannot be read right now; watch it again shortly.")
                % {"room": name},
                name,
            )
            return
        mine.count = count
        await connection.send_json({"type": "room_count", "room": name, "count": count})

    def _joins_needed(self, name: str) -> list[Awaitable[Any]]:
        """The group joins a new watch of ``name`` waits for: the room's group and the group
        of every process with room views, each unless another connection here needs it (then
        its join still on its way to the layer, if any)."""
        joins: list[Awaitable[Any]] = []
        for group, needed in (
            (self.watching.group(name), self.registry.needs_room(name)),
            (rooms_group_name(), self.registry.needs_rooms()),
        ):
            if not needed:
                joins.append(self.groups.join(group))
            elif (turn := self.groups.joining(group)) is not None:
                joins.append(asyncio.shield(turn))
        return joins

    async def unwatch(self, connection: Connection, room: Room) -> None:
        """``unwatch_room_count``: no more counts of the room (none was watched: nothing)."""
        mine = self.sent.get(connection, {}).get(room.name)
        if mine is not None:
            await self._stop(connection, room.name, mine)

    async def _stop(
        self, connection: Connection, name: str, mine: _Sent, linger: bool = True
    ) -> None:
        """``connection`` no longer watches ``name`` (if ``mine`` is still its watch): the
        groups no connection here needs any more are left (``linger``: after a while, as a
        room's are, the next page mostly watching the same rooms)."""
        watched = self.sent.get(connection)
        if watched is None or watched.get(name) is not mine:
            return
        del watched[name]
        if not watched:
            del self.sent[connection]
        if not self.watching.discard(connection, name):
            return
        self.pending.pop(name, None)
        self.delivered_at.pop(name, None)
        unneeded = [] if self.registry.needs_room(name) else [self.watching.group(name)]
        if not self.registry.needs_rooms():
            unneeded.append(rooms_group_name())
        if linger:
            self.groups.let_go(unneeded)
        else:
            for group in unneeded:
                await self.groups.leave(group)

    async def detach(self, connection: Connection) -> None:
        """``connection`` closed: it watches nothing any more."""
        for name, mine in list(self.sent.get(connection, {}).items()):
            await self._stop(connection, name, mine)

    # --- changes ---

    def changed(self, room: str, announced_at: float | None = None) -> None:
        """Members joined, left or changed in ``room``: counted again at the first tick after
        the change (made at ``announced_at``, as room diffs), at most once per window, if a
        connection here watches it."""
        if room not in self.watching.members:
            return
        tick = next_tick(announced_at, self.delivered_at.get(room, -math.inf))
        self.pending[room] = min(self.pending.get(room, math.inf), tick)
        self._wake.set()

    def members_changed(self) -> None:
        """What others may see of some users changed (privacy, blocks): every watched room is
        counted again (a count read per room, whoever the users are)."""
        for room in list(self.watching.members):
            self.changed(room)

    def again(self, rooms: Iterable[str], after: float) -> None:
        """Count these watched rooms again, ``after`` seconds from now at the latest (tick_by),
        unless they are due sooner already."""
        for room in rooms:
            if room in self.watching.members:
                last = self.delivered_at.get(room, -math.inf)
                self.pending.setdefault(room, tick_by(after, last))
        self._wake.set()

    async def run(self, running: Callable[[], bool]) -> None:
        """Count the rooms whose window ended, and ask the rules again once per
        HEARTBEAT_INTERVAL, while ``running()``."""
        loop = asyncio.get_running_loop()
        self.checked_at = time.time()
        while running():
            now = loop.time()
            due = [room for room, at in self.pending.items() if is_due(at, now)]
            if due:
                for room in due:
                    self.delivered_at[room] = self.pending.pop(room)
                try:
                    await self.deliver(due)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("Presence: counting watched rooms failed; retrying")
                    self.again(due, get_settings().RETRY_INTERVAL)
                continue
            if passed(time.time(), self.checked_at, get_settings().HEARTBEAT_INTERVAL):
                self.checked_at = time.time()
                await self._logged(self.recheck())
            self._wake.clear()
            soonest = min(self.pending.values(), default=now + RULES_TICK)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(soonest - now, RULES_TICK))

    async def deliver(self, rooms: list[str]) -> None:
        """Count these rooms for their watchers here; send each watcher whose count changed
        its new count."""
        viewers_by_room = {
            room: {c.viewer_id for c in self.watching.members.get(room, ())} for room in rooms
        }
        viewers_by_room = {room: viewers for room, viewers in viewers_by_room.items() if viewers}
        if not viewers_by_room:
            return
        self.rounds += 1
        counts = await acounts_for_viewers(viewers_by_room)
        unread = [room for room, found in counts.items() if found is None]
        if unread:
            # Redis could not be read: counted again later (the last count sent stands).
            self.again(unread, get_settings().RETRY_INTERVAL)
        told: dict[Connection, list[tuple[str, _Sent, dict[str, Any]]]] = {}
        waiting: list[str] = []
        for room, found in counts.items():
            if found is None:
                continue
            for connection in list(self.watching.members.get(room, ())):
                mine = self.sent.get(connection, {}).get(room)
                count = found.get(connection.viewer_id)
                if mine is None or count is None:
                    continue  # watching since the read began: its own answer was read after
                if mine.count is None:
                    # Its first answer is on its way, maybe read before this change.
                    waiting.append(room)
                    continue
                if mine.count == count:
                    continue  # nothing new for this viewer: nothing sent
                fresh = _Sent(count)
                self.sent[connection][room] = fresh
                frame = {"type": "room_count", "room": room, "count": count}
                told.setdefault(connection, []).append((room, fresh, frame))
        if waiting:
            self.again(waiting, get_settings().COALESCE_WINDOW)

        async def send_counts(connection: Connection) -> None:
            # Looked at when it goes (it may have waited behind a held send): not after an
            # unwatch, nor after a newer count (a later window's, or a watch again's answer).
            for room, fresh, frame in told[connection]:
                if self.sent.get(connection, {}).get(room) is fresh:
                    await connection.send_json(frame)

        await self.sending.send(told, send_counts, "a room count")

    # --- the rooms' rules ---

    def requested(self, room: str, users: Collection[UserId] | None) -> None:
        """``recheck_room`` reached this process: the room's rule asked again for its watchers
        here (those users), in a task of its own."""
        if room not in self.watching.members:
            return
        task = asyncio.ensure_future(self._logged(self.recheck([room], users)))
        self.asked.add(task)
        task.add_done_callback(self.asked.discard)

    async def _logged(self, pass_: Any) -> None:
        try:
            await pass_
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Presence: asking rooms' rules again for watchers failed")

    async def recheck(
        self, rooms: Collection[str] | None = None, users: Collection[UserId] | None = None
    ) -> int:
        """Ask the rules again for the watchers here of ``rooms`` (all: None) among ``users``
        (all: None); a refused one stops watching and is told. How many were refused."""
        names = list(self.watching.members) if rooms is None else list(rooms)
        wanted = None if users is None else set(users)
        pairs: dict[tuple[UserId, str], list[Connection]] = {}
        for name in names:
            if not needs_asking(parse_room(name)):
                continue
            for connection in self.watching.members.get(name, ()):
                if wanted is None or connection.viewer_id in wanted:
                    pairs.setdefault((connection.viewer_id, name), []).append(connection)
        if not pairs:
            return 0
        asked = list(pairs)
        allowed = await averdicts([(pairs[key][0].user, parse_room(key[1])) for key in asked])
        refused = [key for key, ok in zip(asked, allowed, strict=True) if not ok]
        for key in refused:
            name = key[1]
            for connection in pairs[key]:
                mine = self.sent.get(connection, {}).get(name)
                if mine is None:
                    continue
                await self._stop(connection, name, mine)
                try:
                    await _tell(
                        connection,
                        "forbidden",
                        gettext("You may no longer see the count of the room %(room)s.")
                        % {"room": name},
                        name,
                    )
                except Exception:  # a connection closing must not stop the others
                    logger.debug("Presence: could not tell a refused watcher", exc_info=True)
        return len(refused)


async def _tell(connection: Any, code: str, message: str, room: str) -> None:
    """An error naming ``room`` (the consumer's send_error; a stand-in of the hub's tests
    gets the frame as it is)."""
    send_error = getattr(connection, "send_error", None)
    if send_error is not None:
        await send_error(code, message, room=room)
    else:
        await connection.send_json(
            {"type": "error", "code": code, "message": message, "room": room}
        )
