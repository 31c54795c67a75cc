"""A window's ``room_diff`` frames (presence.hub.rooms): what each view of a room must be told
of the room's changed users, read once for all of them (presence.rooms.delta), and the frames
sent, each distinct one serialized once."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from presence import metrics
from presence.domain import UserId, visibly_differs
from presence.domain.rooms import Member
from presence.hub.registry import Connection, View
from presence.rooms.delta import RoomDelta
from presence.rooms.listing import rank


def _same(before: Member, after: Member) -> bool:
    return before.meta == after.meta and not visibly_differs(before.presence, after.presence)


def diff(
    view: View, delta: RoomDelta, viewer: UserId, changed: set[UserId], limit: int
) -> dict[str, Any] | None:
    """The room_diff that brings ``view`` to what ``viewer`` may see now, or None."""
    joins: dict[UserId, Member] = {}
    leaves: list[UserId] = []
    #: listed members moved past the list's end: only a refill may list them again
    moved_out: set[UserId] = set()
    # Whether members may wait past the list's end: the list was full, others counted. Taken
    # before this window's leaves: a place they free is not room for a member the viewer may
    # see (a fresh read lists the first one waiting there; the refill's), only a list that
    # had room lists every member the viewer may see.
    waiting = len(view.listed) >= limit and view.others > 0
    for user_id in view.listed.keys() & changed:
        member = delta.member_for(viewer, user_id)
        if member is not None and user_id != viewer and user_id in view.ranks:
            # Its stay ended and it joined anew (in one window): its place is its new join
            # time. Past a full list's last member while others wait, it leaves the list, and
            # the place freed is refilled as a fresh read fills it (refill), with it if it
            # ranks. (A list with room lists every member the viewer may see: it stays.) No
            # ranks left: every other listed member moved out before it, and so does it.
            moved = _rank_of(delta, user_id, delta.contacts.get(viewer, set()))
            if moved != view.ranks[user_id]:
                del view.ranks[user_id]
                if waiting and (not view.ranks or moved > max(view.ranks.values())):
                    member = None
                    moved_out.add(user_id)
                else:
                    view.ranks[user_id] = moved
        if member is None:
            del view.listed[user_id]
            view.ranks.pop(user_id, None)
            leaves.append(user_id)
        elif not _same(view.listed[user_id], member):
            view.listed[user_id] = joins[user_id] = member
    if viewer in delta.resolving:
        _take_places(view, delta, viewer, limit, joins, leaves, moved_out, waiting)
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


def _take_places(
    view: View,
    delta: RoomDelta,
    viewer: UserId,
    limit: int,
    joins: dict[UserId, Member],
    leaves: list[UserId],
    moved_out: set[UserId],
    waiting: bool,
) -> None:
    """The changed users ``viewer`` may list and does not, listed as a fresh read lists them:
    the first ``limit`` in the listing order (the viewer, its contacts, then by join time). Each
    takes a place left, else the place of the list's last member when it comes before it (a
    contact, or a member who joined earlier and just became visible to the viewer), who counts
    in ``others`` from then on. ``waiting``: the list was full with members counted in
    ``others``, who may come before a newcomer: a place this window's leaves freed goes to one
    that comes before the list's last member, else to the refill (the first members by join
    time, the newcomer among them if it comes first)."""
    newcomers = [
        (uid, member)
        for uid, member in delta.listable(viewer)
        if uid not in view.listed and uid not in moved_out
    ]
    if not newcomers:
        return
    contacts = delta.contacts.get(viewer, set())
    # In the listing order: the viewer, its contacts, then the others as ``listable`` gives
    # them (by join time, ties by id): each comes after the one before it, so the first that
    # a full list does not take ends the pass.
    ordered = [(_rank_of(delta, uid, contacts), uid, m) for uid, m in newcomers if uid == viewer]
    ordered += sorted(
        (
            (_rank_of(delta, uid, contacts), uid, m)
            for uid, m in newcomers
            if uid in contacts and uid != viewer
        ),
        key=itemgetter(0),
    )
    ordered += [
        (_rank_of(delta, uid, contacts), uid, m)
        for uid, m in newcomers
        if uid not in contacts and uid != viewer
    ]
    added: set[UserId] = set()  # listed by this diff
    for mine, user_id, member in ordered:
        full = len(view.listed) >= limit
        if full or waiting:
            if not view.ranks:  # view.ranks: every listed member but the viewer
                if full or user_id != viewer:
                    break
            else:
                evicted, last = max(view.ranks.items(), key=itemgetter(1))
                if user_id != viewer and last < mine:
                    break  # every listed member comes first, and every later newcomer after
                if full:
                    del view.listed[evicted]
                    del view.ranks[evicted]
                    joins.pop(evicted, None)
                    if evicted not in added:
                        leaves.append(evicted)
        view.listed[user_id] = joins[user_id] = member
        if user_id != viewer:
            view.ranks[user_id] = mine
        added.add(user_id)


def outranked(views: Iterable[tuple[UserId, View]], delta: RoomDelta, limit: int) -> set[UserId]:
    """The viewers ``delta`` did not resolve whose full list the earliest changed user could
    enter: it joined before the list's last member (it was hidden from the viewer and just
    became visible, say). A fresh read would list it ahead of that member: these viewers are
    resolved too (a second read). The changed users of a burst of joins joined after every
    listed member: no viewer here, nothing more read."""
    if not delta.members:
        return set()
    earliest, entry = next(iter(delta.members.items()))
    mine = rank(False, entry.joined_at, earliest)
    return {
        viewer
        for viewer, view in views
        if viewer not in delta.resolving
        and len(view.listed) >= limit
        and view.ranks
        and mine < max(view.ranks.values())
    }


def _rank_of(delta: RoomDelta, user_id: UserId, contacts: set[UserId]) -> tuple[bool, float, str]:
    """A changed user's place in ``view.ranks`` (see :func:`presence.rooms.reading.rank`)."""
    entry = delta.members.get(user_id)
    return rank(user_id in contacts, entry.joined_at if entry else math.inf, user_id)


async def send_frame(connection: Connection, frame: dict[str, Any], texts: dict[Any, str]) -> None:
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


def refill(
    delta: RoomDelta,
    frames: list[tuple[Connection, View, int, dict[str, Any]]],
    freed: set[UserId],
    limit: int,
) -> None:
    """Places freed in full lists, from ``delta``'s first members by join time (and, for a
    list of contacts only, the viewer's contacts present): each frame lists the next ones its
    viewer may see, as a fresh read lists them, contacts first (a list that holds a member
    who is not a contact holds every contact its viewer may see already)."""
    for connection, view, _, frame in frames:
        viewer = connection.viewer_id
        if viewer not in freed or view.reading:
            continue
        contacts = delta.contacts.get(viewer, set())
        candidates = sorted(
            (rank(uid in contacts, joined_at, uid), uid, member)
            for uid, joined_at, member in delta.refill(viewer)
            if uid not in view.listed
        )
        room_left = limit - len(view.listed)
        for place, user_id, member in candidates[: max(room_left, 0)]:
            view.listed[user_id] = member
            view.ranks[user_id] = place
            frame["joins"][str(user_id)] = delta.encoded(member)
            if str(user_id) in frame["leaves"]:  # it moved, and is still among the first
                frame["leaves"].remove(str(user_id))
        view.others = frame["others"] = frame["count"] - len(view.listed)
