"""Exceptions and the approximate last seen on open WebSocket connections: a saved or deleted
PrivacyException reaches them at once; a diff never tells more than a fresh read; nothing is
sent when only the day passes.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import api
from presence.models import LastSeen, PrivacyException, PrivacySettings, UserStatus
from tests.live.sockets import (
    HIDDEN,
    HIDDEN_RECENTLY,
    Sockets,
    assert_silent,
    diff,
    heartbeat,
    lets_see,
    new_user,
    online,
    presence,
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


def online_untimed() -> dict[str, Any]:
    """Online, its time hidden (and no day before today known)."""
    return {**online(), "last_seen": None, "last_seen_approx": None}


async def fresh(target: Any, viewer: Any) -> dict[str, Any]:
    """What a fresh read shows ``viewer`` now (the JSON of the API)."""
    return (await api.aget_presence(target, viewer)).as_dict()


async def test_an_exception_reaches_open_sockets_at_once(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, other = [await new_user(make_user) for _ in range(3)]
    await lets_see(target, other)  # a contact of the target, no exception
    await sync_to_async(PrivacySettings.objects.create)(user=target, online_visibility="nobody")
    await sockets.open(target)
    watcher = await sockets.open(viewer)
    bystander = await sockets.open(other)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    assert await subscribe(bystander, target) == state({target.pk: HIDDEN})

    # "Always share my online status with the viewer": only online status, not last seen
    # (its level, contacts, does not admit a stranger).
    assert await api.ashare_with(target, viewer, "online_visibility") is True
    shown = await receive(watcher)
    assert shown == diff({target.pk: online_untimed()})
    assert shown["presences"][str(target.pk)] == await fresh(target, viewer)
    # ... then last seen too.
    assert await api.ashare_with(target, viewer, "last_seen_visibility") is True
    assert await receive(watcher) == diff({target.pk: online()})
    # The admin's way (a row saved, then deleted) takes the same route.
    row = await PrivacyException.objects.aget(owner=target, setting="online_visibility")
    row.allow = False
    await sync_to_async(row.save)()
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    await sync_to_async(row.delete)()
    # Back to the level (nobody): the same as the "never share" showed, so nothing to tell;
    # and others saw nothing of any of it.
    await assert_silent(watcher, bystander)
    assert await fresh(target, viewer) == HIDDEN


async def test_a_never_share_hides_from_one_contact_only(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, friend = [await new_user(make_user) for _ in range(3)]
    await lets_see(target, viewer, friend)
    await sockets.open(target)
    watcher, other = await sockets.open(viewer), await sockets.open(friend)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    assert await subscribe(other, target) == state({target.pk: online()})
    assert await api.ashare_with(target, viewer, "last_seen_visibility", allow=False) is True
    hidden_time = online_untimed()
    assert await receive(watcher) == diff({target.pk: hidden_time})
    await assert_silent(other)
    # Heartbeats move last seen; the viewer's view of it does not move (nothing to tell).
    clock.shift(40)
    await api.atouch(target)
    await assert_silent(watcher)
    assert (await fresh(target, viewer)) == hidden_time
    assert await api.aunshare(target, viewer, "last_seen_visibility") is True
    assert await receive(watcher) == diff({target.pk: online(40)})


async def test_nothing_is_sent_when_only_the_day_passes(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """The bucket moves at UTC midnight with no event: no diff goes out (no thundering herd);
    a fresh read has the new bucket, and so does the next diff of that user."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await sync_to_async(UserStatus.objects.create)(user=target, text="Back soon")
    # Last seen two days ago (by the UTC day): "recently" until midnight, then "within_week".
    today = int(time.time() // 86_400) * 86_400
    seen = datetime.fromtimestamp(today - 2 * 86_400 + 3600, tz=UTC)
    await sync_to_async(LastSeen.objects.record_many)({target.pk: seen.timestamp()})
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN_RECENTLY})
    clock.move_to(datetime.fromtimestamp(today + 86_400 + 60, tz=UTC))  # past midnight
    await heartbeat(watcher)  # the viewer's socket stays alive meanwhile
    await assert_silent(watcher)
    assert (await fresh(target, viewer))["last_seen_approx"] == "within_week"
    await sync_to_async(PrivacySettings.objects.create)(user=target, activity_visibility="everyone")
    assert await receive(watcher) == diff(
        {target.pk: presence(text="Back soon", last_seen_approx="within_week")}
    )


async def test_coming_online_tells_a_stranger_nothing_until_midnight(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """The approximate last seen counts from the days before today: a user who comes online
    moves no stranger's bucket at that moment (no diff, the same fresh read); the day's
    activity counts from the next midnight."""
    viewer, fresh_user, returning = [await new_user(make_user) for _ in range(3)]
    today = int(time.time() // 86_400) * 86_400
    # Away five days (last seen in Redis then, kept as the prior when today's activity comes).
    with time_machine.travel(today - 5 * 86_400 + 3600, tick=False):
        await api.atouch(returning)
    watcher = await sockets.open(viewer)
    away = presence(last_seen_approx="within_week")
    assert await subscribe(watcher, fresh_user, returning) == state(
        {fresh_user.pk: HIDDEN, returning.pk: away}
    )
    await sockets.open(fresh_user)  # never seen before: first visit, over the WebSocket
    await api.atouch(returning)  # back, a page view
    clock.shift(60)
    await heartbeat(watcher)
    await assert_silent(watcher)
    assert await fresh(fresh_user, viewer) == HIDDEN
    assert await fresh(returning, viewer) == away
    # At midnight today's activity counts: "recently" for both, on the next read.
    clock.move_to(datetime.fromtimestamp(today + 86_400 + 60, tz=UTC))
    assert (await fresh(fresh_user, viewer))["last_seen_approx"] == "recently"
    assert (await fresh(returning, viewer))["last_seen_approx"] == "recently"
