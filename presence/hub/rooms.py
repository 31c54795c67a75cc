"""Rooms in the hub: each connection's view of the rooms it is in, and ``room_diff`` frames
coalesced per room per window.

A connection in a room is a member of ``registry.rooms`` (the process joins the room's
channel-layer group with its first connection there, and the group of every process with room
views). Announcements say only "these users changed in room R" (joins, leaves, meta) or "what
others may see of these users changed" (privacy, contacts, blocks, status: every room here
looks at them again). A room's changes are delivered at the first tick after them of the
process's grid, a tick every COALESCE_WINDOW, so at most once per window and at times no
change a viewer may not see moves (presence.hub.room_windows); then the room is read once
for all its viewers here (``presence.rooms.delta``: the changed users only) and each view is
compared with what its connection was sent (presence.hub.room_diffs). A viewer who sees no
change gets no frame, at no different time. See presence.rooms.delta for why a window costs
O(viewers x changed users it may list), not O(members²).

What each connection was sent of each room, and which rooms it joined, are the registry's
(presence.hub.registry); a connection's join and leave are presence.rooms.live's, which call
:meth:`RoomViews.enter` and :meth:`RoomViews.exit`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from presence import admission, announce
from presence.announce import rooms_group_name
from presence.conf import get_settings
from presence.domain import UserId
from presence.domain.rooms import Member, RoomState, parse_room
from presence.hub import sends
from presence.hub.groups import Groups
from presence.hub.registry import Connection, Registry, View
from presence.hub.room_counts import RoomCounts
from presence.hub.room_diffs import diff, outranked, refill, send_frame
from presence.hub.room_refresh import refresh_views
from presence.hub.room_rules import RoomRules
from presence.hub.room_windows import RoomWindows
from presence.rooms.cards import add_cards
from presence.rooms.cursors import with_next
from presence.rooms.delta import aroom_delta, list_limit
from presence.rooms.joins import JoinBatches
from presence.rooms.live import ConnectionRooms
from presence.rooms.reading import SCAN_FACTOR, wider
from presence.rooms.writes import asweep_rooms
from presence.store import get_store

logger = logging.getLogger("presence")


class RoomViews:
    """The rooms of this process's connections, and their deliveries."""

    def __init__(
        self, registry: Registry, groups: Groups, sending: sends.InOrder | None = None
    ) -> None:
        self.registry = registry
        self.groups = groups
        #: room_diffs and a refresh's room_states go through it (the hub's: after each
        #: connection's other frames, and no round held by a client that reads nothing)
        self.sending = sending if sending is not None else sends.InOrder()
        #: connection -> room -> what it was last sent of the room (the registry's)
        self.views: dict[Connection, dict[str, View]] = registry.rooms.views
        #: the rooms with changes to deliver, and when
        self.windows = RoomWindows()
        #: outages of presence's Redis and channel-layer failures seen so far (see sweep)
        self._troubles_seen = (get_store().recoveries(), announce.layer_failures, 0)
        #: views a refresh could not read in full: refreshed again at the next sweep
        self._refresh_again: set[tuple[Connection, str]] = set()
        #: the rooms' rules asked again for the members here (presence.hub.room_rules)
        self.rules = RoomRules(registry)
        #: the rooms' counts watched here without joining (presence.hub.room_counts)
        self.counts = RoomCounts(registry, groups, self.sending)
        #: the joins of each room made at about the same time, written and read together
        #: (gathered a while when sockets wait for a place: presence.admission)
        self.joins = JoinBatches(admission.gather_while_waiting)

    # --- membership ---

    def rooms_of(self, connection: Connection) -> ConnectionRooms:
        """The rooms ``connection`` joined (the registry's from its first join on); for a
        connection no longer in the hub, rooms of its own that nothing keeps."""
        joined = self.registry.rooms.joined
        rooms = joined.get(connection)
        if rooms is None:
            rooms = ConnectionRooms(connection, self)  # type: ignore[arg-type]
            if connection in self.registry.connections:
                joined[connection] = rooms
        return rooms

    async def enter(self, connection: Connection, room: str) -> View:
        """Put ``connection`` in ``room`` (its view is read by the caller, :meth:`show`);
        once this returns, changes announced to the room reach this process."""
        memberships = self.registry.rooms
        none_before = not memberships.members
        if connection not in self.registry.connections:
            return View()  # detached meanwhile: nothing may be added for it
        view = self.views.setdefault(connection, {}).get(room)
        if view is None:
            view = self.views[connection][room] = View()
        view.reading = True
        view.generation += 1
        group = memberships.group(room)
        # The room's group and, with the process's first room view, the group of every
        # process with room views: joined at once (each group's turns keep their order).
        joins: list[Awaitable[Any]] = []
        if memberships.add(connection, room):
            joins.append(self.groups.join(group))
        elif (turn := self.groups.joining(group)) is not None:
            joins.append(asyncio.shield(turn))
        if none_before and memberships.members:
            joins.append(self.groups.join(rooms_group_name()))
        if joins:
            await asyncio.gather(*joins)
        return view

    def show(self, connection: Connection, room: str, state: RoomState) -> None:
        """The room_state just read for ``connection``: what it is sent from now on."""
        view = self.views.get(connection, {}).get(room)
        if view is not None:
            view.show(state, connection.viewer_id)

    def rejoining(self, connection: Connection, room: str, meta: str | None) -> RoomState | None:
        """``connection`` joins ``room`` again: the room as last sent, its own meta ``meta``,
        from its view, which deliveries skip until :meth:`show` or :meth:`resume` (as while a
        room_state is read); None while it is being read or lists no viewer (read the room)."""
        view = self.views.get(connection, {}).get(room)
        own = None if view is None or view.reading else view.listed.get(connection.viewer_id)
        if view is None or own is None:
            return None
        view.reading, view.generation = True, view.generation + 1
        members = {**view.listed, connection.viewer_id: Member(meta, own.presence)}
        state = RoomState(parse_room(room), members, view.others, dict(view.ranks))
        return with_next(state, connection.viewer_id, not view.others, view.read_to)

    def resume(self, connection: Connection, room: str) -> None:
        """A join again failed: the view is delivered to again, as it was."""
        view = self.views.get(connection, {}).get(room)
        if view is not None:
            view.reading = False

    def refresh_later(self, connection: Connection, room: str) -> None:
        """``connection``'s view of ``room`` is sent a fresh room_state at the next sweep (a
        read of it was dropped: a join again's that failed, which a refresh under way yielded
        to)."""
        self._refresh_again.add((connection, room))

    async def exit(self, connection: Connection, room: str, linger: bool = True) -> None:
        """Take ``connection`` out of ``room``. ``linger``: a room it was in (see below);
        otherwise (a join refused or failed) the groups it needed are left now: nothing of a
        join that did not happen stays, in the channel layer either."""
        views = self.views.get(connection)
        if views is not None:
            views.pop(room, None)
            if not views:
                del self.views[connection]
        memberships = self.registry.rooms
        if memberships.discard(connection, room):
            self.windows.forget(room)
            # The groups linger (presence.hub.groups.LINGER), as a user's group does once a
            # socket closed: a page left (presence.js leaves on pagehide) is mostly followed
            # by the next page of the site joining the same rooms moments later. Meanwhile
            # their messages find no view here and are dropped (see changed).
            # (Not while a connection here watches the room's count: presence.hub.room_counts.)
            unneeded = [] if self.registry.needs_room(room) else [memberships.group(room)]
            if not self.registry.needs_rooms():
                unneeded.append(rooms_group_name())
            if linger:
                self.groups.let_go(unneeded)
            else:
                for group in unneeded:
                    await self.groups.leave(group)

    async def detach(self, connection: Connection) -> None:
        for room in self.registry.rooms.keys_of(connection):
            await self.exit(connection, room)
        await self.counts.detach(connection)

    # --- changes ---

    def changed(self, room: str, user_ids: Iterable[UserId], announced_at: float | None) -> None:
        """Users joined, left or changed in ``room``: delivered at the first tick after the
        change (made at ``announced_at``), if a connection here is in it."""
        if room in self.registry.rooms.members:
            self.windows.changed(room, user_ids, announced_at)
        self.counts.changed(room, announced_at)

    def members_changed(self, user_ids: Iterable[UserId]) -> None:
        """What others may see of these users changed: every room here looks at them again,
        and their own connections here renew their rooms' invisible flags."""
        users = set(user_ids)
        for room in list(self.registry.rooms.members):
            self.changed(room, users, None)
        self.counts.members_changed()
        for connection, rooms in list(self.registry.rooms.joined.items()):
            if connection.viewer_id in users:
                task = asyncio.ensure_future(rooms.recheck_rooms())
                task.add_done_callback(_log_failure)

    # --- sweeps and recovery ---

    async def sweep(self, catch_ups: int = 0) -> None:
        """Every SWEEP_INTERVAL: remove members whose stay ended (any process may), and after
        an outage of presence's Redis, a failed channel-layer call or a catch-up of a process
        that fell behind its channel (``catch_ups``, Recovery's: announcements may have been
        lost), send every view here a fresh room_state."""
        await asweep_rooms()
        troubles = (get_store().recoveries(), announce.layer_failures, catch_ups)
        if troubles != self._troubles_seen:
            self._troubles_seen = troubles
            await self.refresh()
        elif self._refresh_again:  # views Redis could not read in full last time
            wanted, self._refresh_again = self._refresh_again, set()
            # Views added during the refresh (refresh_later, a delivery's) are kept.
            failed = await refresh_views(self, wanted, self.sending)
            self._refresh_again |= failed

    async def refresh(self) -> None:
        """Join every room's group again and send each view a fresh room_state (it replaces
        what the client shows), once the rules were asked again (a refusal may have been
        announced while the layer failed: a refused member gets no fresh state)."""
        await self.rules.check_all()
        if self.registry.needs_rooms():
            await self.groups.join(rooms_group_name())
        for room in {*self.registry.rooms.members, *self.registry.room_counts.members}:
            await self.groups.join(self.registry.rooms.group(room))
        # Every watched count is read again (announcements may have been lost).
        self.counts.members_changed()
        everyone = {(c, room) for c, views in self.views.items() for room in views}
        # Views added during the refresh (refresh_later, a delivery's) are kept.
        self._refresh_again = set()
        failed = await refresh_views(self, everyone, self.sending)
        self._refresh_again |= failed

    def view_of(self, connection: Connection, room: str) -> View | None:
        return self.views.get(connection, {}).get(room)

    def _still_shows(self, connection: Connection, room: str, view: View) -> bool:
        """Whether ``view``, taken before an await, is still the connection's view of the room:
        not if the connection left it (a leave, a refusal by the rule), though it may have
        joined it again since (a new view, read after the change being delivered)."""
        return self.view_of(connection, room) is view

    # --- delivery ---

    async def deliver(self, room: str, user_ids: set[UserId]) -> None:
        """Read the room's changed users once, then send each view here what it must be told.

        Pairs are resolved only for the viewers that could list a changed user: those listing
        one (it may have left or changed) and those whose list has room. A viewer whose list
        is full and lists none of them gets its count only: the changed users are not its
        listed members, and a fresh read would not list them ahead of those either (its
        contacts and the members who joined before them come first; see docs/rooms.md),
        unless one joined before its last listed member (it just became visible, say): such
        viewers are resolved in a second read (room_diffs.outranked).
        When a listed member leaves a full list (``others`` > 0), the first members by join
        time are read once too (further down for the viewers who may see none of them past
        their list), and the freed place is refilled in the same diff.

        A view being read meanwhile (its room_state) gets these users again a window later;
        the views sent them do not (a burst's second batch of joiners, being read while the
        first is delivered, made every view resolve the first batch twice)."""
        connections = list(self.registry.rooms.members.get(room, ()))
        windows = self.windows
        if windows.delivering == room and windows.delivering_to is not None:
            connections = [c for c in connections if c in windows.delivering_to]
        ready: dict[Connection, tuple[View, int]] = {}
        #: connections to deliver these users to again; ``everyone``: to all in the room
        again: set[Connection] = set()
        everyone = False
        for connection in connections:
            view = self.views.get(connection, {}).get(room)
            if view is None or view.reading:
                again.add(connection)
            else:
                ready[connection] = (view, view.generation)
        if ready:
            limit = list_limit()
            # A view listing only its own viewer among the changed users (a burst's joiner:
            # itself joined) needs no pairs: it is SELF to itself.
            resolving = {
                connection.viewer_id
                for connection, (view, _) in ready.items()
                if len(view.listed) < limit
                or any(uid != connection.viewer_id for uid in view.listed.keys() & user_ids)
            }
            delta = await aroom_delta(
                parse_room(room), {c.viewer_id for c in ready}, user_ids, resolving
            )
            if delta is None:
                # Redis is unavailable: tried again later, nothing is guessed.
                self._again(room, user_ids, get_settings().RETRY_INTERVAL)
                return
            # A changed user who joined before a full list's last member (it just became
            # visible, say) is listed at once, as a fresh read lists it: those viewers are
            # resolved too, in a second read (none in a burst of joins).
            early = outranked(((c.viewer_id, v) for c, (v, _) in ready.items()), delta, limit)
            late = None
            if early:
                late = await aroom_delta(parse_room(room), early, user_ids, early)
                everyone = everyone or late is None
            unrefilled: set[Connection] = set()
            frames = await _diff_frames(
                room, ready, user_ids, delta, late, early, again, unrefilled
            )
            # Lists whose freed places Redis could not refill (slow, down): no later window
            # would (the members waiting are not among its changed users): a fresh
            # room_state at the next sweep.
            self._refresh_again.update((connection, room) for connection in unrefilled)
            # The cards of the members joining some list: each user's once for all viewers.
            await add_cards([frame["joins"] for *_, frame in frames])
            texts: dict[Any, str] = {}  # identical frames are serialized once
            ready_frames: dict[Connection, tuple[View, int, dict[str, Any]]] = {}
            for connection, view, generation, frame in frames:
                if not self._still_shows(connection, room, view):
                    continue  # out of the room meanwhile: its next view is read after this
                if view.generation != generation or view.reading:
                    again.add(connection)
                else:
                    ready_frames[connection] = (view, generation, frame)

            async def send_current(connection: Connection) -> None:
                view, generation, frame = ready_frames[connection]
                # Looked at again when it goes (it may have waited behind a held send): a leave
                # or a refusal may have taken the connection out of the room, and a room_state
                # since (a join again's, which goes apart from this queue, or a refresh's) has
                # this change in it already (made from the view, or read after this diff's
                # delta): this older diff must not follow it.
                if (
                    self._still_shows(connection, room, view)
                    and view.generation == generation
                    and not view.reading
                ):
                    await send_frame(connection, frame, texts)

            # Each connection's after its frames asked before; the round does not wait for a
            # client that reads nothing (presence.hub.sends).
            await self.sending.send(ready_frames, send_current, "a room diff")
        if everyone or again:
            only = None if everyone else again
            self._again(room, user_ids, get_settings().COALESCE_WINDOW, only)

    def _again(
        self, room: str, user_ids: set[UserId], after: float, only: set[Any] | None = None
    ) -> None:
        if room in self.registry.rooms.members:
            self.windows.again(room, user_ids, after, only)

    async def run(self, running: Callable[[], bool]) -> None:
        """Deliver each room when its window ends, while ``running()``."""
        await self.windows.run(
            running,
            lambda room, users: self.deliver(room, users),  # as patched on the instance
            lambda room, users: self._again(room, users, get_settings().RETRY_INTERVAL),
        )


async def _diff_frames(
    room: str,
    ready: dict[Connection, tuple[View, int]],
    user_ids: set[UserId],
    delta: Any,
    late: Any,
    early: set[UserId],
    again: set[Connection],
    unrefilled: set[Connection],
) -> list[tuple[Connection, View, int, dict[str, Any]]]:
    """Each ready view's room_diff of ``user_ids`` (views read meanwhile go into ``again``),
    places freed in full lists refilled in the same frames (those Redis could not read for go
    into ``unrefilled``)."""
    limit = list_limit()
    frames: list[tuple[Connection, View, int, dict[str, Any]]] = []
    freed: set[UserId] = set()
    #: viewers whose list was full before this window (others counted)
    was_full: set[UserId] = set()
    for connection, (view, generation) in ready.items():
        if view.generation != generation or view.reading:
            again.add(connection)  # a room_state was read meanwhile: compared again
            continue
        had_others = view.others > 0
        if had_others and len(view.listed) >= limit:
            was_full.add(connection.viewer_id)
        viewer = connection.viewer_id
        seen = late if late is not None and viewer in early else delta
        frame = diff(view, seen, viewer, user_ids, limit)
        if frame is not None:
            frames.append((connection, view, generation, frame))
            if frame["leaves"] and had_others and len(view.listed) < limit:
                freed.add(connection.viewer_id)
    # Places freed in full lists: the first members by join time are read once for those
    # viewers. A full list's members waiting may all be past them (most of the first ones
    # hidden from its viewer): its viewers read further down, as a fresh read does
    # (presence.rooms.reading's widening), else the list kept a place a later newcomer
    # would take. Redis unavailable: the frames go as they are (counted right), and those
    # views are sent a fresh room_state later.
    scan = SCAN_FACTOR * limit
    # A list of contacts only (a viewer with more contacts here than the list's places) may
    # be refilled by a contact who joined anywhere: those viewers' contacts are looked up.
    contacts_only = {
        connection.viewer_id
        for connection, view, _, _ in frames
        if connection.viewer_id in freed
        and all(not not_contact for not_contact, *_ in view.ranks.values())
    }
    while freed:
        scanned = await aroom_delta(parse_room(room), freed, (), freed, scan, contacts_only & freed)
        if scanned is None:
            unrefilled.update(c for c, *_ in frames if c.viewer_id in freed)
            break
        refill(scanned, frames, freed, limit)
        further = None if scanned.scan_complete else wider(scan, limit)
        if further is None:
            break
        scan = further
        short = freed & was_full
        freed = {
            connection.viewer_id
            for connection, view, _, _ in frames
            if connection.viewer_id in short and len(view.listed) < limit and view.others > 0
        }
    return frames


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("Presence: renewing rooms failed", exc_info=task.exception())
