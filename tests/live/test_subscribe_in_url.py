"""Subscribing in the opening request (docs/websocket.md): ``ws/presence/?users=ID,ID&since=STAMP``
is answered at connect exactly as the subscribe frame ``{"users": [...], "since": STAMP}`` would
be, on a socket of the same viewer: only what changed since the stamp (the others
``unchanged``), the full snapshot without a stamp (or with one that proves nothing), bad input
told with the subscribe's own error codes, the connection open, nothing subscribed. A stranger
learns nothing through it that bulk_presence would not show them.

Helpers: tests/live/sockets.py and tests/live/test_stamped_subscribe.py (the page, its stamp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from presence import api
from presence.models import Block, PrivacySettings
from tests.ids import missing_id, wire_id
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    assert_silent,
    diff,
    new_user,
    presence_settings,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.live.test_stamped_subscribe import (
    answered,
    ids,
    page_of,
    render_page,
    resolved,
    subscribe_since,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]

NO_SINCE: Any = object()


def query(users: list[Any], since: Any = NO_SINCE) -> str:
    """The opening request's query, as presence.js builds it (each id encoded on its own)."""
    text = "?users=" + ",".join(quote(str(wire_id(user)), safe="") for user in users)
    if since is not NO_SINCE:
        text += "&since=" + quote(since or "", safe="")
    return text


async def opened_with(sockets: Sockets, viewer: Any, text: str) -> WebsocketCommunicator:
    communicator = sockets.make(viewer, text)
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected
    return communicator


async def first_frame(sockets: Sockets, viewer: Any, text: str) -> dict[str, Any]:
    communicator = await opened_with(sockets, viewer, text)
    return await communicator.receive_json_from(timeout=TIMEOUT)


def but_stamp(frame: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in frame.items() if key != "stamp"}


async def assert_as_the_frame(
    sockets: Sockets, viewer: Any, targets: list[Any], since: Any
) -> dict[str, Any]:
    """The URL's answer is the subscribe frame's (on another socket of the viewer, at the same
    moment), and merged onto nothing more than the full snapshot."""
    by_url = await first_frame(sockets, viewer, query(targets, since))
    by_frame = await subscribe_since(await sockets.open(viewer), since, *targets)
    assert but_stamp(by_url) == but_stamp(by_frame)
    answered(by_url, viewer)
    return by_url


# --- the answer is the subscribe frame's ----------------------------------------------------------


async def test_a_page_nothing_changed_since_is_answered_at_connect_with_nothing(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, targets = await page_of(make_user, clock)
    stamp, shown = await render_page(viewer, *targets)
    clock.shift(5)

    frame = await assert_as_the_frame(sockets, viewer, targets, stamp)

    assert frame["presences"] == {}
    assert frame["unchanged"] == ids(*targets)
    assert shown == await resolved(viewer, *targets)


async def test_what_changed_since_the_page_is_answered_at_connect(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, targets = await page_of(make_user, clock)
    stamp, shown = await render_page(viewer, *targets)
    clock.shift(1)
    await sync_to_async(api.set_status)(targets[1], "dnd", text="in a meeting")
    await sync_to_async(Block.objects.create)(blocker=targets[2], blocked=viewer)
    clock.shift(4)

    frame = await assert_as_the_frame(sockets, viewer, targets, stamp)

    now = await resolved(viewer, *targets)
    assert frame["presences"] == {k: now[k] for k in map(str, ids(targets[1], targets[2]))}
    assert frame["unchanged"] == ids(targets[0])
    assert {**shown, **frame["presences"]} == now


async def test_no_since_gets_the_full_snapshot_without_a_stamp(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, targets = await page_of(make_user, clock)

    by_url = await first_frame(sockets, viewer, query(targets))
    by_frame = await subscribe(await sockets.open(viewer), *ids(*targets))

    assert by_url == by_frame
    assert by_url == {"type": "presence_state", "presences": await resolved(viewer, *targets)}


async def test_an_empty_since_gets_the_full_snapshot_and_a_stamp(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, targets = await page_of(make_user, clock)

    frame = await assert_as_the_frame(sockets, viewer, targets, None)

    assert frame["presences"] == await resolved(viewer, *targets)
    assert frame["unchanged"] == []


async def test_a_change_after_the_opening_answer_comes_as_a_diff(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, targets = await page_of(make_user, clock)
    stamp, _ = await render_page(viewer, *targets)
    clock.shift(5)
    communicator = await opened_with(sockets, viewer, query(targets, stamp))
    assert (await communicator.receive_json_from(timeout=TIMEOUT))["presences"] == {}

    await sync_to_async(api.set_status)(targets[0], "dnd", text="away")

    expected = await resolved(viewer, targets[0])
    assert await communicator.receive_json_from(timeout=TIMEOUT) == diff(expected)


async def test_unknown_ids_in_the_url_are_told_as_the_frame_tells_them(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, targets = await page_of(make_user, clock, count=2)
    nobody = missing_id()
    communicator = await opened_with(sockets, viewer, query([*targets, nobody]))
    by_url = [await communicator.receive_json_from(timeout=TIMEOUT) for _ in range(2)]

    other = await sockets.open(viewer)
    await other.send_json_to({"type": "subscribe", "users": ids(*targets, nobody)})
    by_frame = [await other.receive_json_from(timeout=TIMEOUT) for _ in range(2)]

    assert by_url == by_frame
    assert by_url[1]["code"] == "unknown_users"
    assert by_url[1]["users"] == [wire_id(nobody)]


# --- privacy --------------------------------------------------------------------------------------


async def test_a_stranger_subscribing_in_the_url_learns_nothing_more(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    contact, targets = await page_of(make_user, clock, count=2)
    stranger = await new_user(make_user)
    await sync_to_async(PrivacySettings.objects.create)(
        user=targets[0], online_visibility="contacts", last_seen_visibility="contacts"
    )
    await sync_to_async(api.set_status)(targets[0], "dnd", text="private")
    # The contact's own page stamp, handed on by the stranger: it proves nothing for them.
    contact_stamp, _ = await render_page(contact, *targets)
    clock.shift(5)

    for since in (NO_SINCE, None, contact_stamp):
        frame = await first_frame(sockets, stranger, query(targets, since))
        assert frame["presences"] == await resolved(stranger, *targets)
        assert frame.get("unchanged", []) == []
    hidden = frame["presences"][str(wire_id(targets[0]))]
    assert hidden["status"] == "offline"
    assert hidden["text"] is None
    assert hidden["last_seen"] is None


# --- bad input: the subscribe's errors, the connection open, nothing subscribed -------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("?users=1,,2", "invalid_value"),
        ("?users=%FF", "invalid_value"),
        ("?users=" + "x" * 300, "invalid_value"),
        ("?since=123.abc", "invalid_message"),
        ("?users=1&users=2", "invalid_message"),
        ("?users=1&since=" + "9" * 65, "invalid_value"),
    ],
    ids=["empty-id", "not-utf8", "id-too-long", "since-alone", "users-twice", "since-too-long"],
)
async def test_a_bad_subscription_in_the_url_is_an_error_and_the_socket_stays(
    sockets: Sockets, make_user: Callable[..., Any], text: str, code: str
) -> None:
    viewer = await new_user(make_user)
    target = await new_user(make_user)
    communicator = await opened_with(sockets, viewer, text)

    frame = await communicator.receive_json_from(timeout=TIMEOUT)

    assert frame["type"] == "error"
    assert frame["code"] == code
    # Nothing was subscribed; a subscribe frame still works.
    await sync_to_async(api.set_status)(target, "dnd", text="not sent")
    await assert_silent(communicator)
    assert (await subscribe(communicator, wire_id(target)))["type"] == "presence_state"


async def test_more_ids_in_the_url_than_the_limit_is_too_many_subscriptions(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, targets = await page_of(make_user, clock, count=3)
    with presence_settings(MAX_SUBSCRIPTIONS=2):
        communicator = await opened_with(sockets, viewer, query(targets))
        frame = await communicator.receive_json_from(timeout=TIMEOUT)

        assert frame["type"] == "error"
        assert frame["code"] == "too_many_subscriptions"
        await sync_to_async(api.set_status)(targets[0], "dnd", text="not sent")
        await assert_silent(communicator)


async def test_a_query_string_longer_than_a_frame_is_refused(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    viewer = await new_user(make_user)
    with presence_settings(MAX_FRAME_BYTES=1024):
        communicator = await opened_with(sockets, viewer, "?users=" + ",".join(["12"] * 400))
        frame = await communicator.receive_json_from(timeout=TIMEOUT)

    assert frame["type"] == "error"
    assert frame["code"] == "invalid_value"
    assert "1024" in frame["message"]


@pytest.mark.parametrize("text", ["?device=web", "?users=", "?users&since=", "?users=&device=web"])
async def test_a_socket_without_a_subscription_in_its_url_is_sent_nothing_at_connect(
    sockets: Sockets, make_user: Callable[..., Any], text: str
) -> None:
    viewer = await new_user(make_user)
    communicator = await opened_with(sockets, viewer, text)

    await assert_silent(communicator)
