"""Rooms across real daphne processes sharing one Redis: a join on one process reaches a
viewer on another (room diffs travel through the channel layer), a close leaves after
OFFLINE_GRACE, a killed process's members leave within CONNECTION_TTL (the survivor's
sweep), and recheck_room, called from a third process, drops a refused member at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group

from presence import api
from presence.models import PrivacySettings
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)
from tests.load.test_multiprocess import (
    GRACE,
    MARGIN,
    TIMINGS,
    TTL,
    Socket,
    bare_session_of,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

ROOM = "post:1"
SETTINGS = {**TIMINGS, "ROOMS": {"post": None}}


def room_frame(frame: dict[str, Any]) -> bool:
    return frame.get("type") in ("room_state", "room_diff") and frame.get("room") == ROOM


def view_of(socket: Socket) -> tuple[set[str], int]:
    """The room as the socket's frames so far build it (listed ids, count)."""
    listed: set[str] = set()
    count = 0
    for frame in socket.frames:
        if not room_frame(frame):
            continue
        if frame["type"] == "room_state":
            listed = set(frame["members"])
        else:
            listed = (listed - set(frame["leaves"])) | set(frame["joins"])
        count = frame["count"]
    return listed, count


def until_view(socket: Socket, listed: set[str], count: int, timeout: float) -> float:
    """Seconds until the socket's view of the room is ``listed`` with ``count``."""
    started = time.monotonic()
    while view_of(socket) != (listed, count):
        socket.wait_for(room_frame, timeout=timeout, since=len(socket.frames))
    return time.monotonic() - started


def test_rooms_across_processes(
    daphne: Callable[..., Daphne], make_user: Callable[..., Any]
) -> None:
    ann, ben = make_user("ann"), make_user("ben")
    for user in (ann, ben):
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
    first, second = daphne(SETTINGS), daphne(SETTINGS)
    viewer = Socket(first, bare_session_of(ann))
    viewer.send({"type": "join", "room": ROOM})
    viewer.wait_for(lambda f: f.get("type") == "room_state")
    member = Socket(second, bare_session_of(ben))
    member.send({"type": "join", "room": ROOM, "meta": {"mode": "editing"}})
    state = member.wait_for(lambda f: f.get("type") == "room_state")
    assert set(state["members"]) == {str(ann.pk), str(ben.pk)}
    until_view(viewer, {str(ann.pk), str(ben.pk)}, 2, timeout=5)

    # A close: gone after the grace (and not long after).
    member.close()
    closed = time.monotonic()
    until_view(viewer, {str(ann.pk)}, 1, timeout=GRACE + 1 + MARGIN + 5)
    after = time.monotonic() - closed
    assert GRACE - 0.1 <= after <= GRACE + 1 + MARGIN, f"left {after:.2f} s after the close"

    # A crash: the process dies; the survivor's sweep removes its member after the TTL.
    again = Socket(second, bare_session_of(ben))
    again.send({"type": "join", "room": ROOM})
    again.wait_for(lambda f: f.get("type") == "room_state")
    until_view(viewer, {str(ann.pk), str(ben.pk)}, 2, timeout=5)
    second.kill()
    killed = time.monotonic()
    until_view(viewer, {str(ann.pk)}, 1, timeout=TTL + GRACE + MARGIN + 5)
    after = time.monotonic() - killed
    assert after <= TTL + 1 + MARGIN, f"left {after:.2f} s after the crash"
    viewer.close()


def test_recheck_room_reaches_the_members_process(
    daphne: Callable[..., Daphne], make_user: Callable[..., Any], settings: Any
) -> None:
    """The member's socket is on one process, the viewer's on another, and recheck_room is
    called from this one (as from a view): the refusal travels through the channel layer. The
    processes' own periodic check is HEARTBEAT_INTERVAL (30 s) away."""
    club = {**TIMINGS, "HEARTBEAT_INTERVAL": 30, "CONNECTION_TTL": 60}
    club["ROOMS"] = {"club": "tests.rooms.rules.in_group"}
    settings.PRESENCE = club
    ann, ben = make_user("ann"), make_user("ben")
    group = Group.objects.create(name="club-1")
    for user in (ann, ben):
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
        user.groups.add(group)
    first, second = daphne(club), daphne(club)
    viewer = Socket(first, bare_session_of(ann))
    viewer.send({"type": "join", "room": "club:1"})
    viewer.wait_for(lambda f: f.get("type") == "room_state")
    member = Socket(second, bare_session_of(ben))
    member.send({"type": "join", "room": "club:1"})
    member.wait_for(lambda f: f.get("type") == "room_state")
    # Listed, not only counted: any delivery reads the count afresh (the viewer's own change
    # can bring count 2 before ben's join is delivered), and a leave of a member never listed
    # has nothing to take out.
    viewer.wait_for(lambda f: str(ben.pk) in f.get("joins", f.get("members", {})), timeout=5)
    ben.groups.remove(group)
    asked = time.monotonic()
    api.recheck_room("club:1", users=[ben])
    refused = member.wait_for(lambda f: f.get("type") == "error", timeout=5)
    assert (refused["code"], refused["room"]) == ("forbidden", "club:1")
    gone = viewer.wait_for(lambda f: str(ben.pk) in f.get("leaves", ()), timeout=5)
    assert gone["count"] == 1 and gone["joins"] == {}
    assert time.monotonic() - asked < 10  # long before the processes' own check (30 s)
    viewer.close()
    member.close()
