"""presence.admission: a process works on a few sockets' openings at once (a reconnect storm);
the others are accepted at once and wait their turn, first come first served, until the one
before them had its first snapshot, closed, or held its place for OPENING_HOLD (both settings:
PRESENCE["OPENINGS_AT_ONCE"], PRESENCE["OPENING_HOLD"])."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from presence import admission
from tests.ids import wire_id
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    assert_silent,
    new_user,
    receive,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets


def admit_one_at_a_time(settings: Any, hold: float) -> None:
    settings.PRESENCE = {**settings.PRESENCE, "OPENINGS_AT_ONCE": 1, "OPENING_HOLD": hold}


@pytest.fixture
def one_at_a_time(settings: Any) -> None:
    admit_one_at_a_time(settings, hold=30.0)


async def second_behind_first(
    sockets: Sockets, make_user: Callable[..., Any]
) -> tuple[WebsocketCommunicator, WebsocketCommunicator]:
    """Two sockets opened in turn, both accepted at once; the first holds the one place, the
    second has asked for its snapshot and waits its turn."""
    ahead, behind = [await new_user(make_user) for _ in range(2)]
    first = sockets.make(ahead)
    assert (await first.connect(timeout=TIMEOUT))[0]
    second = sockets.make(behind)
    assert (await second.connect(timeout=TIMEOUT))[0]
    await second.send_json_to({"type": "subscribe", "users": []})
    return first, second


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_slot_is_given_back_once_and_to_the_first_waiting() -> None:
    slot = await admission.admit()
    slot.release()
    slot.release()  # a second release frees no second place
    again = await admission.admit()
    first = asyncio.ensure_future(admission.admit())
    second = asyncio.ensure_future(admission.admit())
    await asyncio.sleep(0.05)
    assert not first.done() and not second.done()
    again.release()
    assert (await asyncio.wait_for(first, TIMEOUT)).held
    await asyncio.sleep(0.05)
    assert not second.done()
    first.result().release()
    (await asyncio.wait_for(second, TIMEOUT)).release()


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_socket_is_accepted_at_once_and_its_snapshot_waits_for_the_one_before(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    ahead, behind, target = [await new_user(make_user) for _ in range(3)]
    first = sockets.make(ahead)
    assert (await first.connect(timeout=TIMEOUT))[0]
    second = sockets.make(behind)
    # The handshake is not held (daphne drops one not accepted within 5 s).
    assert (await second.connect(timeout=TIMEOUT))[0]
    await second.send_json_to({"type": "subscribe", "users": [wire_id(target)]})
    await assert_silent(second)
    assert (await subscribe(first, target))["type"] == "presence_state"
    answer = await receive(second)
    assert answer["type"] == "presence_state"
    assert list(answer["presences"]) == [str(wire_id(target))]


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_socket_that_closes_before_subscribing_gives_its_place_back(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    first, second = await second_behind_first(sockets, make_user)
    await assert_silent(second)
    await sockets.close(first)
    assert (await receive(second))["type"] == "presence_state"


async def test_a_socket_that_never_subscribes_holds_its_place_for_opening_hold_only(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    admit_one_at_a_time(settings, hold=0.5)
    _, second = await second_behind_first(sockets, make_user)
    await assert_silent(second, seconds=0.2)
    assert (await receive(second))["type"] == "presence_state"
