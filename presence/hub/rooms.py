"""Rooms in the hub: each connection's view of the rooms it is in, and ``room_diff`` frames
coalesced per room per window.

A connection in a room is a member of ``registry.rooms`` (the process joins the room's
channel-layer group with its first connection there, and the group of every process with room
views). Announcements say only "these users changed in room R" (joins, leaves, meta) or "what
others may see of these users changed" (privacy, contacts, blocks, status: every room here
looks at them again). A room's changes are gathered for COALESCE_WINDOW from the first one,
and a room is delivered at most once per window (late announcements wait for the next);
then the room is read once for all its viewers here (``api.aroom_delta``: the changed users
only) and each view is compared with what its connection was sent. A viewer who sees no
change gets no frame, at no different time. See presence.api._room_events for why a window
costs O(viewers x changed users it may list), not O(members²).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from presence import announce, metrics
from presence.announce import rooms_group_name
from presence.api import _room_events as events
from presence.api._cards import add_cards
from presence.api._rooms import SCAN_FACTOR, aread_room_state, rank
from presence.conf import get_settings
from presence.domain import UserId, visibly_differs
from presence.domain.rooms import Member, RoomState, parse_room
from presence.hub.groups import Groups
from presence.hub.registry import Connection, Registry
from presence.hub.room_rules import RoomRules
from presence.store import get_store

logger = logging.getLogger("presence")


@dataclass
class View:
    """What a connection was last sent of a room."""

    listed: dict[UserId, Member] = field(default_factory=dict)
    #: each listed member's place in the listing order but the viewer's (_rooms.rank)
    ranks: dict[UserId, tuple[bool, float, str]] = field(default_factory=dict)
    others: int = 0
    #: a room_state is being read (changes meanwhile are delivered again after it)
    reading: bool = True
    #: bumped at each room_state: a delta read before it must not be applied to it
    generation: int = 0


def _same(before: Member, after: Member) -> bool:
    return before.meta == after.meta and not visibly_differs(before.presence, after.presence)


class RoomViews:
    """The rooms of this process's connections, and their deliveries."""

    def __init__(self, registry: Registry, groups: Groups) -> None:
        self.registry = registry
        self.groups = groups
        self.views: dict[Connection, dict[str, View]] = {}
        #: room -> (changed users, loop time its window ends)
        self.pending: dict[str, tuple[set[UserId], float]] = {}
        #: the room being delivered now, if any
        self.delivering: str | None = None
        #: room -> loop time its last delivery began (the next one waits a window after it)
        self.delivered_at: dict[str, float] = {}
        self._wake = asyncio.Event()
        #: outages of presence's Redis and channel-layer failures seen so far (see sweep)
        self._troubles_seen = (get_store().recoveries(), announce.layer_failures)
        #: the rooms' rules asked again for the members here (presence.hub.room_rules)
        self.rules = RoomRules(registry)

    # --- membership ---

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
            view.listed = dict(state.members)
            view.ranks = dict(state.ranks)
            view.others = state.others
            view.reading = False

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
        return RoomState(parse_room(room), members, view.others, dict(view.ranks))

    def resume(self, connection: Connection, room: str) -> None:
        """A join again failed: the view is delivered to again, as it was."""
        view = self.views.get(connection, {}).get(room)
        if view is not None:
            view.reading = False

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
            self.pending.pop(room, None)
            self.delivered_at.pop(room, None)
            # The groups linger (presence.hub.groups.LINGER), as a user's group does once a
            # socket closed: a page left (presence.js leaves on pagehide) is mostly followed
            # by the next page of the site joining the same rooms moments later. Meanwhile
            # their messages find no view here and are dropped (see changed).
            unneeded = [memberships.group(room)]
            if not memberships.members:
                unneeded.append(rooms_group_name())
            if linger:
                self.groups.let_go(unneeded)
            else:
                for group in unneeded:
                    await self.groups.leave(group)

    async def detach(self, connection: Connection) -> None:
        for room in self.registry.rooms.keys_of(connection):
            await self.exit(connection, room)

    # --- changes ---

    def changed(self, room: str, user_ids: Iterable[UserId], announced_at: float | None) -> None:
        """Users joined, left or changed in ``room``: delivered after its coalescing window
        (counted from ``announced_at``, as presence diffs are)."""
        if room not in self.registry.rooms.members:
            return
        loop_now = asyncio.get_running_loop().time()
        full = window = get_settings().COALESCE_WINDOW
        if announced_at is not None:
            window -= min(max(time.time() - announced_at, 0.0), window)
        # At most one delivery per window: announcements that arrive late (a busy channel
        # layer) would otherwise each be delivered at once, a frame per join in a burst.
        after_last = self.delivered_at.get(room, -math.inf) + full
        users, due = self.pending.get(room, (set(), max(loop_now + window, after_last)))
        users.update(user_ids)
        self.pending[room] = (users, due)
        self._wake.set()

    def members_changed(self, user_ids: Iterable[UserId]) -> None:
        """What others may see of these users changed: every room here looks at them again,
        and their own connections here renew their rooms' invisible flags."""
        users = set(user_ids)
        for room in list(self.registry.rooms.members):
            self.changed(room, users, None)
        for connection in list(self.views):
            if connection.viewer_id in users:
                recheck = getattr(connection, "recheck_rooms", None)
                if recheck is not None:
                    task = asyncio.ensure_future(recheck())
                    task.add_done_callback(_log_failure)

    # --- sweeps and recovery ---

    async def sweep(self) -> None:
        """Every SWEEP_INTERVAL: remove members whose stay ended (any process may), and after
        an outage of presence's Redis or a failed channel-layer call (announcements may have
        been lost), send every view here a fresh room_state."""
        await events.asweep_rooms()
        troubles = (get_store().recoveries(), announce.layer_failures)
        if troubles != self._troubles_seen:
            self._troubles_seen = troubles
            await self.refresh()

    async def refresh(self) -> None:
        """Join every room's group again and send each view a fresh room_state (it replaces
        what the client shows), once the rules were asked again (a refusal may have been
        announced while the layer failed: a refused member gets no fresh state)."""
        await self.rules.check_all()
        if self.registry.rooms.members:
            await self.groups.join(rooms_group_name())
        for room in list(self.registry.rooms.members):
            await self.groups.join(self.registry.rooms.group(room))
        for connection, views in list(self.views.items()):
            for room, view in list(views.items()):
                view.reading = True
                view.generation += 1
                try:
                    state = await aread_room_state(parse_room(room), connection.user)
                    frame = {"type": "room_state", **state.as_dict()}
                    await add_cards([frame["members"]])
                    self.show(connection, room, state)
                    await connection.send_json(frame)
                except Exception:
                    view.reading = False
                    logger.warning("Presence: refreshing a room view failed", exc_info=True)

    # --- delivery ---

    async def deliver(self, room: str, user_ids: set[UserId]) -> None:
        """Read the room's changed users once, then send each view here what it must be told.

        Pairs are resolved only for the viewers that could list a changed user: those listing
        one (it may have left or changed) and those whose list has room. A viewer whose list
        is full and lists none of them gets its count only: the changed users are not its
        listed members, and a fresh read would not list them ahead of those either (its
        contacts and the members who joined before them come first; see docs/rooms.md).
        When a listed member leaves a full list (``others`` > 0), the first members by join
        time are read once too, and the freed place is refilled in the same diff."""
        connections = list(self.registry.rooms.members.get(room, ()))
        ready: dict[Connection, tuple[View, int]] = {}
        again = False
        for connection in connections:
            view = self.views.get(connection, {}).get(room)
            if view is None or view.reading:
                again = True
            else:
                ready[connection] = (view, view.generation)
        if ready:
            limit = events.list_limit()
            resolving = {
                connection.viewer_id
                for connection, (view, _) in ready.items()
                if len(view.listed) < limit or not view.listed.keys().isdisjoint(user_ids)
            }
            delta = await events.aroom_delta(
                parse_room(room), {c.viewer_id for c in ready}, user_ids, resolving
            )
            if delta is None:
                # Redis is unavailable: tried again later, nothing is guessed.
                self._again(room, user_ids, get_settings().RETRY_INTERVAL)
                return
            frames: list[tuple[Connection, View, int, dict[str, Any]]] = []
            freed: set[UserId] = set()
            for connection, (view, generation) in ready.items():
                if view.generation != generation or view.reading:
                    again = True  # a room_state was read meanwhile: compared with it again
                    continue
                had_others = view.others > 0
                frame = _diff(view, delta, connection.viewer_id, user_ids, limit)
                if frame is not None:
                    frames.append((connection, view, generation, frame))
                    if frame["leaves"] and had_others and len(view.listed) < limit:
                        freed.add(connection.viewer_id)
            if freed:
                await self._refill(room, frames, freed, limit)
            # The cards of the members joining some list: each user's once for all viewers.
            await add_cards([frame["joins"] for *_, frame in frames])
            texts: dict[Any, str] = {}  # identical frames are serialized once
            for connection, view, generation, frame in frames:
                if view.generation != generation or view.reading:
                    again = True
                    continue
                try:
                    await _send(connection, frame, texts)
                except Exception:  # a connection closing must not stop the others
                    logger.debug("Presence: could not send a room diff", exc_info=True)
        if again:
            self._again(room, user_ids, get_settings().COALESCE_WINDOW)

    async def _refill(
        self,
        room: str,
        frames: list[tuple[Connection, View, int, dict[str, Any]]],
        freed: set[UserId],
        limit: int,
    ) -> None:
        """Places freed in full lists: the first members by join time are read once for
        those viewers, and each frame lists the next ones its viewer may see, as a fresh read
        lists them (its contacts, listed first, are listed already when visible). Redis
        unavailable: the frames go as they are (counted right; the next room_state lists)."""
        delta = await events.aroom_delta(parse_room(room), freed, (), freed, SCAN_FACTOR * limit)
        if delta is None:
            return
        for connection, view, _, frame in frames:
            viewer = connection.viewer_id
            if viewer not in freed or view.reading:
                continue
            candidates = sorted(
                (joined_at, str(uid), uid, member)
                for uid, joined_at, member in delta.refill(viewer)
                if uid not in view.listed
            )
            room_left = limit - len(view.listed)
            for joined_at, _, user_id, member in candidates[: max(room_left, 0)]:
                view.listed[user_id] = member
                # Not a contact: the viewer's contacts it may see are listed first already.
                view.ranks[user_id] = rank(False, joined_at, user_id)
                frame["joins"][str(user_id)] = delta.encoded(member)
            view.others = frame["others"] = frame["count"] - len(view.listed)

    def _again(self, room: str, user_ids: set[UserId], after: float) -> None:
        if room in self.registry.rooms.members:
            users, due = self.pending.get(room, (set(), asyncio.get_running_loop().time() + after))
            self.pending[room] = (users | user_ids, due)
            self._wake.set()

    async def run(self, running: Callable[[], bool]) -> None:
        """Deliver each room when its window ends, while ``running()``."""
        loop = asyncio.get_running_loop()
        while running():
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            due = [room for room, (_, at) in self.pending.items() if at <= now + 0.005]
            if not due:
                self._wake.clear()
                soonest = min(at for _, at in self.pending.values())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), soonest - now)
                continue
            for room in due:
                users, _ = self.pending.pop(room)
                self.delivering = room
                self.delivered_at[room] = loop.time()
                try:
                    await self.deliver(room, users)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("Presence: delivering a room's changes failed; retrying")
                    self._again(room, users, get_settings().RETRY_INTERVAL)
                finally:
                    self.delivering = None


def _diff(
    view: View, delta: events.RoomDelta, viewer: UserId, changed: set[UserId], limit: int
) -> dict[str, Any] | None:
    """The room_diff that brings ``view`` to what ``viewer`` may see now, or None."""
    joins: dict[UserId, Member] = {}
    leaves: list[UserId] = []
    for user_id in view.listed.keys() & changed:
        member = delta.member_for(viewer, user_id)
        if member is None:
            del view.listed[user_id]
            view.ranks.pop(user_id, None)
            leaves.append(user_id)
        elif not _same(view.listed[user_id], member):
            view.listed[user_id] = joins[user_id] = member
    contacts = delta.contacts.get(viewer, set())
    added: set[UserId] = set()  # listed by this diff
    room_left = limit - len(view.listed)
    if room_left > 0 and viewer in delta.resolving:
        for user_id, member in delta.listable(viewer):  # by join time
            if user_id not in view.listed:
                view.listed[user_id] = joins[user_id] = member
                view.ranks[user_id] = _rank_of(delta, user_id, contacts)
                added.add(user_id)
                room_left -= 1
                if not room_left:
                    break
    if contacts and viewer in delta.resolving:
        # The viewer's contacts are listed first: one that a full list leaves out takes the
        # place of its last member (by the listing order), as a fresh read lists them.
        for mine, user_id in sorted(
            (_rank_of(delta, uid, contacts), uid) for uid in contacts - view.listed.keys()
        ):
            member = delta.member_for(viewer, user_id)
            if member is None:
                continue
            if len(view.listed) >= limit:
                ranked = [(r, uid) for uid, r in view.ranks.items() if uid != viewer]
                if not ranked or max(ranked)[0] < mine:
                    break  # every listed member comes first (earlier contacts)
                evicted = max(ranked)[1]
                del view.listed[evicted]
                del view.ranks[evicted]
                joins.pop(evicted, None)
                if evicted not in added:
                    leaves.append(evicted)
            view.listed[user_id] = joins[user_id] = member
            view.ranks[user_id] = mine
            added.add(user_id)
    count = max(delta.count_for(viewer), len(view.listed))
    others = count - len(view.listed)
    if not joins and not leaves and others == view.others:
        return None
    view.others = others
    return {
        "type": "room_diff",
        "room": delta.room.name,
        "joins": {str(uid): delta.encoded(member) for uid, member in joins.items()},
        "leaves": sorted(str(uid) for uid in leaves),
        "others": others,
        "count": count,
    }


def _rank_of(
    delta: events.RoomDelta, user_id: UserId, contacts: set[UserId]
) -> tuple[bool, float, str]:
    """A changed user's place in ``view.ranks`` (see :func:`presence.api._rooms.rank`)."""
    entry = delta.members.get(user_id)
    return rank(user_id in contacts, entry.joined_at if entry else math.inf, user_id)


async def _send(connection: Connection, frame: dict[str, Any], texts: dict[Any, str]) -> None:
    """Send ``frame``; its JSON text is made once for every connection sent the same frame
    (most viewers of a big room get the same count). A connection without a raw ``send``
    (the hub's tests) gets it through ``send_json``."""
    send = getattr(connection, "send", None)
    if send is None:
        await connection.send_json(frame)
        return
    joins = frame["joins"]
    key = (
        tuple((uid, id(member)) for uid, member in joins.items()),
        tuple(frame["leaves"]),
        frame["others"],
        frame["count"],
    )
    text = texts.get(key)
    if text is None:
        text = texts[key] = json.dumps(frame, separators=(",", ":"))
    metrics.frame_sent("room_diff")
    await send(text_data=text)


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("Presence: renewing rooms failed", exc_info=task.exception())
