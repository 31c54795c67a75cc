"""The WebSocket consumer at ws/presence/: bad input and the rate limit.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
import time_machine
from channels.testing import WebsocketCommunicator

from presence import api, domain
from tests.ids import missing_id, wire_id
from tests.live.sockets import (
    HIDDEN,
    QUIET,
    TIMEOUT,
    Sockets,
    assert_closed_with,
    assert_silent,
    connections_in_redis,
    database_state,
    diff,
    error,
    eventually,
    heartbeat,
    iso,
    lets_see,
    new_user,
    online,
    presence,
    presence_settings,
    receive,
    redis_state,
    send_frame,
    set_own_status,
    set_status,
    state,
    status_reply,
    subscribe,
    subscriptions,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


# --- bad input --------------------------------------------------------------------------------

LONG = "x" * 141
BAD_FRAMES = [
    # (frame text, error code, message)
    ("not json", "invalid_json", "The frame is not valid JSON."),
    ("", "invalid_json", "The frame is not valid JSON."),
    ('{"type": "subscribe", "users": [1]', "invalid_json", "The frame is not valid JSON."),
    # valid JSON, a number longer than Python converts
    (
        '{"type": "subscribe", "users": [' + "9" * 5000 + "]}",
        "invalid_value",
        "A number in the frame has too many digits.",
    ),
    # ... and not valid JSON past such a number: not JSON is what it is told
    (
        '{"type": "subscribe", "users": [' + "9" * 5000,
        "invalid_json",
        "The frame is not valid JSON.",
    ),
    ("[1, 2]", "invalid_message", "Expected a JSON object."),
    ("42", "invalid_message", "Expected a JSON object."),
    ('"subscribe"', "invalid_message", "Expected a JSON object."),
    ("null", "invalid_message", "Expected a JSON object."),
    ("{}", "invalid_message", "'type' is required and must be a string."),
    ('{"users": [1]}', "invalid_message", "'type' is required and must be a string."),
    ('{"type": 5}', "invalid_message", "'type' is required and must be a string."),
    (
        '{"type": "ping"}',
        "unknown_type",
        "Unknown message type 'ping': use one of heartbeat, subscribe, unsubscribe, set_status, "
        "join, leave, room_more, watch_count, unwatch_count, watch_room_count, "
        "unwatch_room_count, watch_feed, unwatch_feed.",
    ),
    *[
        (
            json.dumps({"type": kind, **users}),
            "invalid_message",
            "'users' must be a list of user ids (numbers or strings).",
        )
        for kind in ("subscribe", "unsubscribe")
        for users in (
            {},
            {"users": None},
            {"users": 7},
            {"users": "1,2"},
            {"users": {"1": True}},
            {"users": [True]},
            {"users": [1.5]},
            {"users": [None]},
            {"users": [[1]]},
        )
    ],
    *[
        (
            json.dumps({"type": kind, "users": users}),
            "invalid_value",
            "User ids are positive integers.",
        )
        for kind in ("subscribe", "unsubscribe")
        for users in ([-3], [0], [1, -1])
    ],
    # Strings the site's pk cannot be (an integer or a UUID alike): refused before any lookup.
    *[
        (
            json.dumps({"type": kind, "users": users}),
            "invalid_value",
            f"{bad!r} is not a user id.",
        )
        for kind in ("subscribe", "unsubscribe")
        for users, bad in ((["abc"], "abc"), (["1e3"], "1e3"), (["-1"], "-1"), ([" 7"], " 7"))
    ],
    (
        '{"type": "heartbeat", "state": "asleep"}',
        "invalid_value",
        "Unknown state 'asleep': use 'active' or 'idle'.",
    ),
    ('{"type": "heartbeat", "state": 1}', "invalid_message", "'state' must be 'active' or 'idle'."),
    (
        '{"type": "set_status"}',
        "invalid_message",
        "'status' is required: one of 'auto', 'dnd', 'invisible'.",
    ),
    (
        '{"type": "set_status", "status": 1}',
        "invalid_message",
        "'status' is required: one of 'auto', 'dnd', 'invisible'.",
    ),
    (
        '{"type": "set_status", "status": "busy"}',
        "invalid_value",
        "Unknown status 'busy': use 'auto', 'dnd' or 'invisible'.",
    ),
    (
        '{"type": "set_status", "status": "offline"}',
        "invalid_value",
        "Unknown status 'offline': use 'auto', 'dnd' or 'invisible'.",
    ),
    *[
        (
            json.dumps({"type": "set_status", "status": "auto", field: value}),
            "invalid_value",
            f"'{field}' is {len(value)} characters long; at most {limit}.",
        )
        for field, value, limit in (
            ("text", LONG, 140),
            ("activity", LONG, 140),
            ("emoji", "🙂" * 17, 16),
        )
    ],
    (
        json.dumps({"type": "set_status", "status": "auto", "text": "a\u0007b"}),
        "invalid_value",
        "'text' must not contain control characters.",
    ),
    (
        '{"type": "set_status", "status": "auto", "text": 5}',
        "invalid_message",
        "'text' must be a string or null.",
    ),
    (
        '{"type": "set_status", "status": "dnd", "emoji": ["x"]}',
        "invalid_message",
        "'emoji' must be a string or null.",
    ),
    *[
        (
            json.dumps({"type": "set_status", "status": "dnd", "text": "x", "expires_in": v}),
            "invalid_value",
            "'expires_in' must be between 1 and 2592000 seconds.",
        )
        for v in (-5, 0, 0.5, 30 * 24 * 3600 + 1)
    ],
    *[
        (
            json.dumps({"type": "set_status", "status": "dnd", "text": "x", "expires_in": v}),
            "invalid_message",
            "'expires_in' must be a number of seconds or null.",
        )
        for v in ("60", True, [60])
    ],
]
#: a frame over MAX_FRAME_BYTES (65536) by one byte, valid JSON otherwise
OVERSIZE = json.dumps({"type": "heartbeat", "pad": ""})
OVERSIZE = OVERSIZE[:-2] + "x" * (65537 - len(OVERSIZE)) + OVERSIZE[-2:]
BAD_FRAMES += [
    (b'{"type": "heartbeat"}', "invalid_message", "Send JSON text frames, not binary ones."),
    (b"\x00\xff", "invalid_message", "Send JSON text frames, not binary ones."),
    (OVERSIZE, "frame_too_large", "The frame is 65537 bytes long; at most 65536."),
    (
        json.dumps({"type": "subscribe", "users": list(range(1, 1002))}),
        "too_many_subscriptions",
        "1001 user ids in one frame; at most 1000.",
    ),
]


#: the frame types this test site accepts: presence's own and the feed's
ACCEPTED_TYPES = frozenset({*domain.CLIENT_TYPES, "watch_feed", "unwatch_feed"})


def answering(frame: str | bytes, code: str) -> dict[str, Any]:
    """What an error answering ``frame`` names of it: its type, where the frame was read as far
    as a type this site accepts (not one refused before it is read: binary, too large, not
    JSON)."""
    if isinstance(frame, bytes) or code == "frame_too_large":
        return {}
    try:
        data = json.loads(frame)
    except ValueError:
        return {}
    if isinstance(data, dict) and data.get("type") in ACCEPTED_TYPES:
        return {"answers": data["type"]}
    return {}


async def test_bad_frames_are_answered_with_errors_and_change_nothing(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    with presence_settings(RATE_LIMIT=(1000, 10)):
        sender, friend, third = [await new_user(make_user) for _ in range(3)]
        await lets_see(sender, friend)
        await lets_see(friend, sender)
        await lets_see(third, sender)
        # The sender has a status of its own and a subscription; a friend watches it.
        tab = await sockets.open(sender)
        mine = presence("dnd", iso(0), ["web"], "Busy", "🔧", invisible=False)
        assert await set_status(tab, status="dnd", text="Busy", emoji="🔧") == status_reply(mine)
        watcher = await sockets.open(friend)
        assert await subscribe(tab, friend, sender) == state({friend.pk: online(), sender.pk: mine})
        assert await subscribe(watcher, sender) == state(
            {sender.pk: presence("dnd", iso(0), ["web"], "Busy", "🔧")}
        )
        redis_before = redis_state(redis_client)
        database_before = await database_state(sender, friend)
        subscribed_before = subscriptions()

        wrong = {}
        for frame, code, message in BAD_FRAMES:
            if isinstance(frame, bytes):
                await tab.send_to(bytes_data=frame)
            else:
                await send_frame(tab, frame)
            reply = await receive(tab)
            if reply != error(code, message, **answering(frame, code)):
                wrong[frame[:80]] = reply
            # The connection is still open and working (an empty subscribe is answered)...
            if (reply := await subscribe(tab)) != state({}):
                wrong[frame[:80]] = reply
            # ... and nothing changed: presence in Redis, choices in the database,
            # subscriptions.
            if redis_state(redis_client) != redis_before:
                wrong[frame[:80]] = "changed Redis"
            if await database_state(sender, friend) != database_before:
                wrong[frame[:80]] = "changed the database"
            if subscriptions() != subscribed_before:
                wrong[frame[:80]] = "changed subscriptions"
        assert wrong == {}
        # Nobody was told anything.
        await assert_silent(tab, watcher)
        assert await subscribe(tab, third) == state({third.pk: HIDDEN})
        # A real change still reaches both, as the very next frame.
        assert await set_own_status(tab, status="auto") == (
            status_reply(online(invisible=False)),
            diff({sender.pk: online(invisible=False)}),
        )
        assert await receive(watcher) == diff({sender.pk: online()})


async def test_unknown_user_ids_are_reported_and_the_others_subscribed(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    missing = [wire_id(missing_id(0)), wire_id(missing_id(1))]
    await watcher.send_json_to(
        {"type": "subscribe", "users": [missing[0], wire_id(target), missing[1]]}
    )
    assert await receive(watcher) == state({target.pk: HIDDEN})
    assert await receive(watcher) == error(
        "unknown_users",
        f"No user has the id(s) {missing[0]}, {missing[1]}; the others are subscribed.",
        users=missing,
        answers="subscribe",
    )
    assert subscriptions() == {target.pk: 1}
    await sockets.open(target)
    assert await receive(watcher) == diff({target.pk: online()})
    # Unknown ids are not remembered: asking again reports them again.
    await watcher.send_json_to({"type": "subscribe", "users": [missing[0]]})
    assert await receive(watcher) == state({})
    assert (await receive(watcher))["users"] == [missing[0]]


async def test_subscriptions_over_the_limit_are_refused_whole(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(MAX_SUBSCRIPTIONS=3):
        viewer = await new_user(make_user)
        one, two, three, four = [await new_user(make_user) for _ in range(4)]
        for user in (one, two, three, four):
            await lets_see(user, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, one, two) == state({one.pk: HIDDEN, two.pk: HIDDEN})

        # Two more would make four: nothing of that frame is subscribed.
        assert await subscribe(watcher, three, four) == error(
            "too_many_subscriptions",
            "This would make 4 subscriptions; at most 3 per connection. "
            "Unsubscribe from some first.",
            answers="subscribe",
        )
        assert subscriptions() == {one.pk: 1, two.pk: 1}
        # Four in one frame are refused before anything else.
        assert await subscribe(watcher, one, two, three, four) == error(
            "too_many_subscriptions", "4 user ids in one frame; at most 3.", answers="subscribe"
        )
        await sockets.open(three)
        await sockets.open(two)
        assert await receive(watcher) == diff({two.pk: online()})  # not three
        await assert_silent(watcher)

        # Ids already subscribed do not count twice; after an unsubscribe there is room.
        assert await subscribe(watcher, one, two, three) == state({three.pk: online()})
        await watcher.send_json_to({"type": "unsubscribe", "users": [wire_id(one)]})
        assert await subscribe(watcher, four) == state({four.pk: HIDDEN})
        assert subscriptions() == {two.pk: 1, three.pk: 1, four.pk: 1}


async def test_every_error_answering_a_frame_names_its_type(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # Errors carry no request id: a client waiting for the answer of its set_status must tell
    # it from the refusal of a subscribe of a malformed id (a page's bad data-presence-user).
    with presence_settings(HTTP_RATE_LIMIT=(1, 60)):
        user = await new_user(make_user)
        tab = sockets.make(user, "?device=fridge")
        assert await tab.connect(timeout=TIMEOUT) == (True, None)
        # An error of the opening request's device answers no frame: it names none.
        assert await receive(tab) == error(
            "invalid_value", "Unknown device 'fridge': use web, mobile or desktop; using web."
        )
        # The subscription of an opening request is answered as a subscribe frame: its errors
        # name a subscribe.
        by_url = sockets.make(user, "?users=not-an-id")
        assert await by_url.connect(timeout=TIMEOUT) == (True, None)
        assert await receive(by_url) == error(
            "invalid_value", "'not-an-id' is not a user id.", answers="subscribe"
        )
        for kind in ("subscribe", "unsubscribe"):
            await tab.send_json_to({"type": kind, "users": ["not-an-id"]})
            assert await receive(tab) == error(
                "invalid_value", "'not-an-id' is not a user id.", answers=kind
            )
        # Errors a handler sends itself name the frame too: unknown ids of a subscribe, a
        # set_status past HTTP_RATE_LIMIT.
        missing = wire_id(missing_id(0))
        await tab.send_json_to({"type": "subscribe", "users": [missing]})
        assert await receive(tab) == state({})
        assert (await receive(tab))["answers"] == "subscribe"
        assert (await set_status(tab, status="dnd"))["type"] == "status"
        refused = await set_status(tab, status="auto")
        assert (refused["code"], refused["answers"]) == ("rate_limited", "set_status")
        # A frame whose type is not one the site accepts names none.
        await tab.send_json_to({"type": "ping"})
        assert "answers" not in await receive(tab)
        # The next answer of a well-formed frame is no error, and unnamed errors stay so.
        assert await subscribe(tab) == state({})
        await assert_silent(tab)


# --- rate limit -------------------------------------------------------------------------------


async def test_flooding_past_the_rate_limit_closes_with_4429(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(RATE_LIMIT=(5, 10)):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)  # frame 1 (open() subscribes to nothing)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})  # 2
        await send_frame(watcher, "not json")  # 3: bad frames count too
        assert (await receive(watcher))["code"] == "invalid_json"
        assert await subscribe(watcher) == state({})  # 4
        await watcher.send_json_to({"type": "heartbeat"})  # 5
        await watcher.send_json_to({"type": "subscribe", "users": []})  # 6: one too many
        assert await watcher.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }

        # The connection ends for presence right after the close (its only one: grace begins).
        async def gone() -> bool:
            return await connections_in_redis(viewer) == []

        assert await eventually(gone)
        assert subscriptions() == {}
        await sockets.open(target)
        assert await watcher.receive_nothing(timeout=QUIET)


async def socket_with_an_empty_window(
    sockets: Sockets, make_user: Callable[..., Any]
) -> WebsocketCommunicator:
    """A new user's accepted socket that has sent no frame yet (``sockets.open`` spends one of
    the rate limit's window on its check)."""
    communicator = sockets.make(await new_user(make_user))
    assert (await communicator.connect(timeout=TIMEOUT))[0]
    return communicator


async def test_rate_limit_is_a_sliding_window(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(RATE_LIMIT=(5, 10)):
        communicator = await socket_with_an_empty_window(sockets, make_user)
        for _ in range(3):  # t=0: 3 frames
            assert await subscribe(communicator) == state({})
        clock.shift(5)
        for _ in range(2):  # t=5: 2 more, 5 in the last 10 s
            assert await subscribe(communicator) == state({})
        clock.shift(5)
        for _ in range(3):  # t=10: the 3 of t=0 have left the window
            assert await subscribe(communicator) == state({})
        await communicator.send_json_to({"type": "subscribe", "users": []})  # 6 within 10 s
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }


async def test_a_clock_stepped_back_does_not_hold_a_full_window_for_the_step(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(RATE_LIMIT=(5, 10)):
        communicator = await socket_with_an_empty_window(sockets, make_user)
        for _ in range(5):  # the window is full
            assert await subscribe(communicator) == state({})
        # NTP steps the clock an hour back: the socket is not refused for the hour.
        clock.shift(-3600)
        for _ in range(5):
            assert await subscribe(communicator) == state({})
        await communicator.send_json_to({"type": "subscribe", "users": []})  # 6 in the window
        await assert_closed_with(communicator, 4429)


async def test_a_heartbeat_keeps_the_devices_of_recent_page_requests(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    await api.atouch(target, "mobile")  # a page request from the phone
    assert await receive(watcher) == diff({target.pk: online(devices=("mobile",))})
    clock.shift(1)
    tab = await sockets.open(target)  # the web app opens its socket a second later
    assert await receive(watcher) == diff({target.pk: online(1, ("web", "mobile"))})
    clock.shift(1)
    await heartbeat(tab)  # changes nothing
    await assert_silent(watcher)
