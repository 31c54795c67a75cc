"""The socket's pages of a room (docs/websocket.md): ``{"type": "room_more", "room", "after"}`` is
answered ``room_page`` with the next members and ``next``; every ``room_state`` (a join, a join
again answered from the view) carries ``next``; a bad cursor is an error frame naming the room,
and a page is charged against RATE_LIMIT as a join is (real Redis, real channel layer,
WebsocketCommunicator)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from presence.domain.rooms import parse_room
from presence.models import PrivacySettings
from presence.rooms import cursors
from presence.store import get_store, merge
from tests.live.sockets import BASE, Sockets, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]

ROOM = "post:1"
SETTINGS = {
    **BASE,
    "ROOMS": ROOMS,
    "CONNECTION_TTL": 3600,
    "ROOM_LIST_LIMIT": 5,
    "RATE_LIMIT": (60, 3600),
}


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = dict(SETTINGS)


@sync_to_async
def fill(room: str, count: int, prefix: str, visibility: str | None = "everyone") -> list[str]:
    """``count`` users in ``room``, a millisecond apart, with one connection each; their ids."""
    model = get_user_model()
    model.objects.bulk_create([model(username=f"{prefix}{i}", password="!") for i in range(count)])
    users = list(model.objects.filter(username__startswith=prefix).order_by("pk"))
    if visibility is not None:
        PrivacySettings.objects.bulk_create(
            [PrivacySettings(user=user, online_visibility=visibility) for user in users]
        )
    from presence import api

    for user in users:
        api.touch(user)
    store = get_store()
    now = time.time()
    plans = [
        store.plans.join_room(room, user.pk, f"c{n}", now + n / 1000)
        for n, user in enumerate(users)
    ]
    assert all(store.run(merge(plans)))
    return [str(user.pk) for user in users]


async def more(socket: Any, after: Any, room: str = ROOM) -> dict[str, Any]:
    await socket.send_json_to({"type": "room_more", "room": room, "after": after})
    return await receive(socket)


async def test_paging_a_room_over_the_socket(sockets: Sockets, make_user: Callable) -> None:
    ids = await fill(ROOM, 23, "sock-page-")
    viewer = await new_user(make_user)
    socket = await sockets.open(viewer)
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
    state = await receive(socket)
    assert state["type"] == "room_state"
    assert list(state["members"]) == [str(viewer.pk), *ids[:4]]
    listed = list(state["members"])
    page = state
    pages = 0
    while page["next"] is not None:
        page = await more(socket, page["next"])
        assert page["type"] == "room_page" and page["room"] == ROOM
        assert set(page) == {"type", "room", "members", "others", "count", "next"}
        assert page["count"] == 24
        # Each member with its card, as in a room_state.
        assert all(member["card"]["name"] for member in page["members"].values())
        listed += list(page["members"])
        pages += 1
    assert listed == [str(viewer.pk), *ids]
    assert pages == 4  # 19 more, 5 a page: the fourth lists 4 and ends
    # A join again (answered from the connection's view) carries a cursor too.
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": {"mode": "x"}})
    again = await receive(socket)
    assert again["type"] == "room_state" and list(again["members"]) == listed[:5]
    page = await more(socket, again["next"])
    assert list(page["members"]) == ids[4:9]


async def test_a_member_found_by_their_tie_far_down_skips_no_one_before_them(
    sockets: Sockets, make_user: Callable, settings: Any
) -> None:
    """As over HTTP (test_paging.py): a join's room_state lists a member who has the joiner
    among their contacts wherever they joined; its cursor starts where its read by join time
    stopped, so the public member who joined in between comes on a page, the other once."""
    settings.PRESENCE = {**SETTINGS, "ROOM_LIST_LIMIT": 2}
    viewer = await new_user(make_user)
    public, admitting = await _far_apart(viewer)
    socket = await sockets.open(viewer)
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
    page = await receive(socket)
    assert list(page["members"]) == [str(viewer.pk), admitting]
    listed = list(page["members"])
    for _ in range(10):
        if page["next"] is None:
            break
        page = await more(socket, page["next"])
        listed += list(page["members"])
    assert page["next"] is None
    assert sorted(listed) == sorted([str(viewer.pk), public, admitting])
    # A join again (answered from the connection's view): its cursor starts no further.
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": {"mode": "x"}})
    again = await receive(socket)
    assert again["type"] == "room_state", again
    assert list(again["members"]) == [str(viewer.pk), admitting]
    paged, cursor = [], again["next"]
    for _ in range(10):
        if cursor is None:
            break
        page = await more(socket, cursor)
        paged, cursor = paged + list(page["members"]), page["next"]
    assert paged == [public]


@sync_to_async
def _far_apart(viewer: Any) -> tuple[str, str]:
    """64 members in the room's index of public ones who show nobody their online status since
    they joined (as many as a first read of 2 reads at its widest), then a public member, then
    one who shows the viewer only (a contact of theirs)."""
    from presence import api
    from presence.models import Contact

    model = get_user_model()
    names = [f"far-{n}" for n in range(66)]
    model.objects.bulk_create([model(username=name, password="!") for name in names])
    users = list(model.objects.filter(username__in=names).order_by("pk"))
    *unlisted, public, admitting = users
    PrivacySettings.objects.bulk_create(
        [PrivacySettings(user=user, online_visibility="nobody") for user in unlisted]
        + [PrivacySettings(user=public, online_visibility="everyone")]
    )
    Contact.objects.create(owner=admitting, contact=viewer)
    store, now = get_store(), time.time()
    for user in users:
        api.touch(user)
    plans = [
        store.plans.join_room(
            ROOM,
            user.pk,
            f"far{n}",
            now + n / 1000,
            public=user is not admitting,
        )
        for n, user in enumerate(users)
    ]
    assert all(store.run(merge(plans)))
    return str(public.pk), str(admitting.pk)


async def test_a_room_never_joined_may_be_paged(sockets: Sockets, make_user: Callable) -> None:
    """As over HTTP: the room's rule is asked, the connection need not be in the room."""
    ids = await fill(ROOM, 8, "sock-nojoin-")
    socket = await sockets.open(await new_user(make_user))
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
    state = await receive(socket)
    await socket.send_json_to({"type": "leave", "room": ROOM})
    page = await more(socket, state["next"])
    assert page["type"] == "room_page" and list(page["members"]) == ids[4:]
    assert page["next"] is None


async def test_bad_pages_are_error_frames_naming_the_room(
    sockets: Sockets, make_user: Callable
) -> None:
    await fill(ROOM, 12, "sock-bad-")
    await fill("post:2", 12, "sock-bad2-")
    socket = await sockets.open(await new_user(make_user))
    await socket.send_json_to({"type": "join", "room": "post:2", "meta": None})
    other = (await receive(socket))["next"]
    for after, code in [
        ("garbage", "invalid_value"),
        (other, "invalid_value"),  # another room's
        ("A" * 5000, "invalid_value"),
    ]:
        frame = await more(socket, after)
        assert frame["type"] == "error" and frame["code"] == code, frame
        assert frame["room"] == ROOM and frame["message"]
    for after in (None, 5, ["x"]):
        frame = await more(socket, after)
        assert (frame["type"], frame["code"]) == ("error", "invalid_message"), frame
    # A cursor of a room whose rule refuses: forbidden, nothing listed.
    refused = cursors.encode(parse_room("group:3"), cursors.Cursor(cursors.START))
    frame = await more(socket, refused, room="group:3")
    assert (frame["code"], frame["room"]) == ("forbidden", "group:3")
    frame = await more(socket, other, room="nosuchkind:1")
    assert (frame["code"], frame["room"]) == ("unknown_room", "nosuchkind:1")
    # The connection goes on.
    assert (await more(socket, other, room="post:2"))["type"] == "room_page"


async def test_a_page_is_charged_as_a_join_is(
    sockets: Sockets, make_user: Callable, settings: Any
) -> None:
    """A stranger's page reads far (32 x ROOM_LIST_LIMIT members past its cursor): it counts
    one frame per 200 members it resolved, so a loop of them is closed with 4429."""
    settings.PRESENCE = {**SETTINGS, "ROOM_LIST_LIMIT": 20, "RATE_LIMIT": (8, 3600)}
    await fill(ROOM, 2000, "sock-cost-", visibility=None)  # a stranger sees none of them
    stranger = await new_user(make_user)
    socket = await sockets.open(stranger)
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
    state = await receive(socket)
    assert list(state["members"]) == [str(stranger.pk)]
    # The join resolved 640 members (3 frames), each page 640 more (3 frames): 8 frames are
    # spent before the room's end (four reads).
    cursor = state["next"]
    answered = 0
    while cursor is not None and answered < 10:
        await socket.send_json_to({"type": "room_more", "room": ROOM, "after": cursor})
        message = await socket.receive_output(timeout=5)
        if message["type"] == "websocket.close":
            assert message["code"] == 4429
            break
        frame = __import__("json").loads(message["text"])
        assert frame["type"] == "room_page" and frame["members"] == {}
        cursor = frame["next"]
        answered += 1
    else:
        raise AssertionError(f"not closed after {answered} pages (cursor {cursor!r})")
    assert answered == 2
