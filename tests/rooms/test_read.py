"""room_presence: who may enter, and who is listed, counted or left out for each viewer
(the privacy matrix), through the one resolver; bounded listing with contacts first."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied

from presence import api, domain
from presence.models import Block, Contact, PrivacySettings
from presence.store import get_store
from tests.rooms.rules import ROOMS

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]

ROOM = "post:1"


@pytest.fixture(autouse=True)
def _rooms(settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS}


def enter(user: Any, room: str = ROOM, meta: str | None = None, invisible: bool = False) -> None:
    """``user`` online (a page view) and in ``room`` (a connection's join)."""
    store = get_store()
    api.touch(user)
    now = __import__("time").time()
    store.run(store.plans.join_room(room, user.pk, f"c{user.pk}", now, meta, invisible=invisible))


def key(user: Any) -> str:
    return str(user.pk)


def test_a_viewer_sees_themselves_with_their_meta(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    enter(viewer, meta='{"mode":"editing"}')
    state = api.room_presence(ROOM, viewer)
    assert state["room"] == ROOM
    assert state["count"] == 1 and state["others"] == 0
    me = state["members"][key(viewer)]
    assert me["meta"] == {"mode": "editing"}
    assert me["presence"]["status"] == "online"
    assert me["presence"]["invisible"] is False


def test_an_empty_room(make_user: Callable[..., Any]) -> None:
    assert api.room_presence(("post", 7), make_user()) == {
        "room": "post:7",
        "members": {},
        "others": 0,
        "count": 0,
        "next": None,
    }


def test_the_privacy_matrix(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    public = make_user()  # everyone may see them online
    follows_viewer = make_user()  # default privacy (contacts), has the viewer as contact
    stranger = make_user()  # default privacy, no tie: hidden, counted in others
    nobody = make_user()  # online_visibility nobody, has the viewer as contact: hidden
    invisible = make_user()  # invisible: neither listed nor counted
    # went invisible after joining, no connection of theirs left to write the room's flag:
    # counted by the flag, as every count is (room_counts, live views), never listed
    invisible_late = make_user()
    blocked_by_viewer = make_user()
    blocks_viewer = make_user()
    close = make_user()  # close_friends, marked the viewer close friend: listed
    not_close = make_user()  # close_friends, has the viewer as a mere contact: hidden
    PrivacySettings.objects.create(user=public, online_visibility="everyone")
    PrivacySettings.objects.create(user=nobody, online_visibility="nobody")
    PrivacySettings.objects.create(user=invisible, online_visibility="everyone", invisible=True)
    PrivacySettings.objects.create(user=close, online_visibility="close_friends")
    PrivacySettings.objects.create(user=not_close, online_visibility="close_friends")
    for owner in (follows_viewer, nobody, not_close, blocked_by_viewer, blocks_viewer):
        Contact.objects.create(owner=owner, contact=viewer)
    Contact.objects.create(owner=close, contact=viewer, close_friend=True)
    Block.objects.create(blocker=viewer, blocked=blocked_by_viewer)
    Block.objects.create(blocker=blocks_viewer, blocked=viewer)
    for user in (viewer, public, follows_viewer, stranger, nobody, blocked_by_viewer):
        enter(user)
    enter(blocks_viewer)
    enter(close)
    enter(not_close)
    enter(invisible, invisible=True)
    enter(invisible_late)
    PrivacySettings.objects.create(
        user=invisible_late, online_visibility="everyone", invisible=True
    )

    state = api.room_presence(ROOM, viewer)
    assert set(state["members"]) == {key(u) for u in (viewer, public, follows_viewer, close)}
    # stranger, nobody, not_close, invisible_late: present but hidden
    assert state["others"] == 4
    assert state["count"] == 8
    assert api.room_counts([ROOM], viewer)[ROOM] == 8
    for user in (public, follows_viewer, close):
        assert state["members"][key(user)]["presence"]["status"] == "online"

    # The stranger sees only the public member listed; blocks are between others.
    seen_by_stranger = api.room_presence(ROOM, stranger)
    assert set(seen_by_stranger["members"]) == {key(stranger), key(public)}
    assert seen_by_stranger["count"] == 10  # all but the invisible member
    # The blocked member sees nothing of the viewer, and is not counted by them either.
    seen_by_blocked = api.room_presence(ROOM, blocked_by_viewer)
    assert key(viewer) not in seen_by_blocked["members"]
    assert seen_by_blocked["count"] == 9


def test_an_invisible_viewer_sees_themselves(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    PrivacySettings.objects.create(user=viewer, invisible=True)
    enter(viewer, invisible=True)
    state = api.room_presence(ROOM, viewer)
    assert state["count"] == 1
    assert state["members"][key(viewer)]["presence"]["invisible"] is True


def test_at_most_the_list_limit_contacts_first(
    make_user: Callable[..., Any], settings: Any
) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 3}
    viewer = make_user()
    members = [make_user() for _ in range(6)]
    for user in members:
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
        enter(user)
    # The viewer follows the last one to join: listed before earlier joiners.
    Contact.objects.create(owner=viewer, contact=members[-1])
    enter(viewer)
    state = api.room_presence(ROOM, viewer)
    assert list(state["members"]) == [key(viewer), key(members[-1]), key(members[0])]
    assert state["others"] == 4
    assert state["count"] == 7


def test_the_async_twin(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    enter(viewer)
    assert async_to_sync(api.aroom_presence)(ROOM, viewer) == api.room_presence(ROOM, viewer)


def test_who_may_enter(make_user: Callable[..., Any], caplog: Any) -> None:
    user = make_user()
    with pytest.raises(api.UnknownRoom) as unknown:
        api.room_presence("nosuchkind:1", user)
    assert unknown.value.code == "unknown_room"
    assert api.room_presence("group:2", user)["count"] == 0
    with pytest.raises(PermissionDenied):
        api.room_presence("group:3", user)
    with pytest.raises(PermissionDenied):
        api.room_presence(ROOM, AnonymousUser())
    with pytest.raises(PermissionDenied):
        api.room_presence(ROOM, None)
    with caplog.at_level(logging.ERROR, logger="presence"), pytest.raises(PermissionDenied):
        api.room_presence("broken:1", user)
    assert "broken" in caplog.text and "RuntimeError" in caplog.text
    with pytest.raises(domain.InvalidInput):
        api.room_presence("post:with space", user)


def test_a_big_room_lists_at_most_the_limit(make_user: Callable[..., Any], settings: Any) -> None:
    """Members past the first 2 * ROOM_LIST_LIMIT by join time are counted, and listed only
    if they are the viewer's contacts (the read stays O(ROOM_LIST_LIMIT))."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 2}
    viewer = make_user()
    members = [make_user() for _ in range(8)]
    for user in members:
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
        enter(user)
    Contact.objects.create(owner=viewer, contact=members[7])
    state = api.room_presence(ROOM, viewer)
    assert list(state["members"]) == [key(members[7]), key(members[0])]
    assert state["count"] == 8


def test_a_viewer_who_may_see_few_of_the_first_members_reads_further(
    make_user: Callable[..., Any], settings: Any
) -> None:
    """The first members hide from the viewer: the read goes further down the join order, so
    a fresh read lists the later members a live view lists (it lists newcomers while it has
    room), up to ROOM_LIST_LIMIT."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 2}
    viewer = make_user()
    hidden = [make_user() for _ in range(6)]
    shown = [make_user() for _ in range(3)]
    for user in hidden:
        PrivacySettings.objects.create(user=user, online_visibility="nobody")
        enter(user)
    for user in shown:
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
        enter(user)
    state = api.room_presence(ROOM, viewer)
    assert list(state["members"]) == [key(shown[0]), key(shown[1])]
    assert (state["others"], state["count"]) == (7, 9)


def test_the_read_goes_no_further_than_its_widest(
    make_user: Callable[..., Any], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from presence.rooms import reading as _rooms

    monkeypatch.setattr(_rooms, "WIDEST_FACTOR", 2)  # the first 2 * ROOM_LIST_LIMIT members
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 2}
    viewer = make_user()
    hidden = [make_user() for _ in range(4)]
    shown = make_user()
    for user in hidden:
        PrivacySettings.objects.create(user=user, online_visibility="nobody")
        enter(user)
    PrivacySettings.objects.create(user=shown, online_visibility="everyone")
    enter(shown)
    state = api.room_presence(ROOM, viewer)
    assert state["members"] == {}
    assert (state["others"], state["count"]) == (5, 5)
