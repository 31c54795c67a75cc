"""A socket's writes stay on its event loop: a database thread does the database work of a
``set_status`` frame (the writes' thread; the API's async writes: the caller's) and nothing
else; the announcement is sent to the channel layer from the caller's own loop. A slow channel
layer therefore holds up neither that thread nor the database work of every other socket of the
process, and a busy sockets' thread does not hold up a user's own change.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model

from presence import api
from presence.announce import CHANGED, group_name
from presence.models import PrivacySettings
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    lets_see,
    new_user,
    presence,
    presence_settings,
    receive,
    state,
    subscribe,
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


class HeldSends:
    """The real channel layer, whose "changed" sends to one user's group wait at a gate (as on
    a slow or distant layer server) and note the event loop that sends them."""

    def __init__(self, layer: Any, user: Any) -> None:
        self.layer, self.group = layer, group_name(user.pk)
        self.send = layer.group_send
        self.started, self.gate = threading.Event(), threading.Event()
        self.loops: list[asyncio.AbstractEventLoop] = []

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if group == self.group and message["type"] == CHANGED:
            self.loops.append(asyncio.get_running_loop())
            self.started.set()
            # Whichever loop sends, it is not blocked: the wait is in a thread of its own.
            await asyncio.get_running_loop().run_in_executor(None, self.gate.wait, 3 * TIMEOUT)
        await self.send(group, message)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any], HeldSends]]:
    opened: list[HeldSends] = []

    def hold(user: Any) -> HeldSends:
        layer = get_channel_layer()
        sends = HeldSends(layer, user)
        monkeypatch.setattr(layer, "group_send", sends.group_send)
        opened.append(sends)
        return sends

    yield hold
    for sends in opened:  # nothing stays held when an assertion failed
        sends.gate.set()


async def in_a_thread(event: threading.Event) -> bool:
    return await asyncio.get_running_loop().run_in_executor(None, event.wait, TIMEOUT)


async def the_database_thread_is_free() -> bool:
    """Whether another job of the database's thread (another socket's read, say) completes
    now. It is left to finish, never cancelled: sync_to_async would wait for it anyway."""
    job = asyncio.ensure_future(
        sync_to_async(get_user_model()._default_manager.exists)()  # the one database thread
    )
    done, _ = await asyncio.wait({job}, timeout=TIMEOUT)
    return job in done


async def written_and_announced(
    held: HeldSends, write: Awaitable[Any], watcher: Any, user: Any, seen: tuple[str, str | None]
) -> Any:
    """Make ``write``; while its announcement waits at the layer's gate, the database's
    thread is free and the send is this loop's; then the watcher sees ``seen`` (status, text)."""
    writing = asyncio.ensure_future(write)
    try:
        assert await in_a_thread(held.started), "the change was never announced"
        assert await the_database_thread_is_free()
        assert held.loops == [asyncio.get_running_loop()]  # not the announcer's loop
        assert not writing.done()  # the write returns once its announcement is sent
    except BaseException:
        writing.cancel()
        raise
    finally:
        held.gate.set()
    result = await writing
    changed = await receive(watcher)
    assert changed["type"] == "presence_diff"
    assert list(changed["presences"]) == [str(user.pk)]
    assert (
        changed["presences"][str(user.pk)]["status"],
        changed["presences"][str(user.pk)]["text"],
    ) == seen
    return result


async def watched_tab(sockets: Sockets, make_user: Callable[..., Any]) -> tuple[Any, ...]:
    """(viewer, user, the viewer's socket watching the user, the user's own socket), the user
    seen online there."""
    viewer, user = await new_user(make_user), await new_user(make_user)
    await lets_see(user, viewer)
    watcher = await sockets.open(viewer)
    assert (await subscribe(watcher, user)) == state({user.pk: presence()})
    tab = await sockets.open(user)
    assert (await receive(watcher))["presences"][str(user.pk)]["status"] == "online"
    return viewer, user, watcher, tab


@pytest.mark.parametrize("rooms", [False, True], ids=["", "rooms"])
async def test_a_status_frames_announcement_is_sent_from_the_consumers_loop(
    sockets: Sockets, make_user: Callable[..., Any], held: Callable[[Any], HeldSends], rooms: bool
) -> None:
    with presence_settings(ROOMS=rooms):
        _, user, watcher, tab = await watched_tab(sockets, make_user)
        sends = held(user)
        await tab.send_json_to({"type": "set_status", "status": "auto", "text": "Lunch"})
        reply = await written_and_announced(sends, receive(tab), watcher, user, ("online", "Lunch"))
        assert reply["type"] == "status" and reply["presence"]["text"] == "Lunch"


async def write_of(name: str, user: Any, viewer: Any) -> Awaitable[Any]:
    if name == "set_status":
        return api.aset_status(user, "auto", text="Lunch")
    if name == "unfollow":
        return api.aunfollow(user, viewer)
    if name == "block":
        return api.ablock(viewer, user)
    if name == "share_with":
        return api.ashare_with(user, viewer, "online_visibility", allow=False)
    assert name == "notify_changed"
    # bulk_create sends no post_save: the site notifies presence itself.
    hidden = PrivacySettings(user_id=user.pk, online_visibility="nobody")
    await sync_to_async(PrivacySettings.objects.bulk_create)([hidden])
    return api.anotify_changed([user], reason="privacy")


WRITES = ["set_status", "unfollow", "block", "share_with", "notify_changed"]


@pytest.mark.parametrize("name", WRITES)
async def test_the_apis_async_writes_announce_from_the_callers_loop(
    sockets: Sockets, make_user: Callable[..., Any], held: Callable[[Any], HeldSends], name: str
) -> None:
    viewer, user, watcher, _ = await watched_tab(sockets, make_user)
    sends = held(user)
    write = await write_of(name, user, viewer)
    # Each of the others hides the user from the viewer.
    seen = ("online", "Lunch") if name == "set_status" else ("offline", None)
    await written_and_announced(sends, write, watcher, user, seen)


async def test_status_frames_of_two_tabs_at_once_are_each_answered_with_their_own_change(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    # Their steps take turns with other work on the loop, but not with each other: each reply
    # is of its own change, and the rows and Redis's copy are of the last one.
    user = await new_user(make_user)
    first, second = await sockets.open(user), await sockets.open(user, "?device=mobile")
    await first.send_json_to({"type": "set_status", "status": "dnd", "text": "Focus"})
    await second.send_json_to({"type": "set_status", "status": "invisible"})
    own = (await receive(first))["presence"]
    assert (own["status"], own["text"], own["invisible"]) == ("dnd", "Focus", False)
    own = (await receive(second))["presence"]
    assert (own["status"], own["text"], own["invisible"]) == ("online", None, True)
    # Whichever came last, the online count's copy of the choice is the rows' (the user is
    # online on two devices: counted unless invisible).
    invisible = await sync_to_async(PrivacySettings.objects.get)(user_id=user.pk)
    assert await api.aonline_count() == (0 if invisible.invisible else 1)


async def test_a_status_frame_is_written_and_announced_while_the_sockets_thread_is_busy(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    # The sockets' database thread busy (a storm of openings' sessions, users and facts): a
    # user's own change does its database work in the writes' thread, and is answered and
    # announced meanwhile; the hub delivers it from a thread of its own.
    _, user, watcher, tab = await watched_tab(sockets, make_user)
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)(TIMEOUT * 3))
    try:
        await tab.send_json_to({"type": "set_status", "status": "auto", "text": "Lunch"})
        reply = await receive(tab)
        assert reply["type"] == "status" and reply["presence"]["text"] == "Lunch"
        seen = await receive(watcher)
        assert seen["type"] == "presence_diff"
        assert seen["presences"][str(user.pk)]["text"] == "Lunch"
        assert not busy.done()  # all of it while the sockets' thread was held
    finally:
        release.set()
        await busy
