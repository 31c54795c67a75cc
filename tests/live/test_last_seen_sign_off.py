"""The approximate last seen when a user leaves during the day (issue 34): the sign-off writes
today's time to the database (the sweep, a logout, presence_cleanup), and still no stranger's
view moves before midnight, on any read path: no diff on an open socket, the same answer from the
Python API, the template tag, the JSON endpoint and a new socket's snapshot; after a Redis flush
too. From midnight the day's activity counts.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.core.management import call_command
from django.template import Context, Template
from django.test import Client, RequestFactory

from presence import api, lifecycle
from presence.conf import get_settings
from presence.models import LastSeen
from tests.clock import T0, at
from tests.live.sockets import (
    Sockets,
    assert_silent,
    heartbeat,
    new_user,
    presence,
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

#: the words of each bucket in {% last_seen %} (English)
WORDS = {"within_week": "last seen within a week", "recently": "last seen recently"}


@sync_to_async
def _sync_reads(target: Any, viewer: Any) -> list[str | None]:
    tag_request = RequestFactory().get("/")
    tag_request.user = viewer if viewer is not None else AnonymousUser()
    tag = Template("{% load presence %}{% last_seen target %}").render(
        Context({"request": tag_request, "target": target})
    )
    client = Client()
    client.force_login(viewer)
    answer = client.get("/presence/api/presence", {"users": str(target.pk)})
    assert answer.status_code == 200
    words = {text: bucket for bucket, text in WORDS.items()}
    return [
        api.get_presence(target, viewer).last_seen_approx,
        api.get_presence(target, None).last_seen_approx,  # anonymous
        words.get(tag, tag or None),
        answer.json()["presences"][str(target.pk)]["last_seen_approx"],
    ]


async def shown(sockets: Sockets, target: Any, viewer: Any) -> list[str | None]:
    """The approximate last seen of ``target`` as ``viewer`` reads it on every path: the Python
    API (and an anonymous one), the template tag, the JSON endpoint, a new socket's snapshot."""
    found = await _sync_reads(target, viewer)
    reader = await sockets.open(viewer)
    snapshot = await subscribe(reader, target)
    await sockets.close(reader)
    return [*found, snapshot["presences"][str(target.pk)]["last_seen_approx"]]


def forget_presence(client: redis.Redis) -> None:
    """A Redis flush of presence's keys (the channel layer's stay: the sockets live on)."""
    for key in list(client.scan_iter("presence:*")):
        client.delete(key)


async def test_leaving_during_the_day_tells_a_stranger_nothing_until_midnight(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    grace = get_settings().OFFLINE_GRACE
    stranger, target = await new_user(make_user), await new_user(make_user)
    # Last seen five days ago; Redis has forgotten it since (presence_cleanup).
    await sync_to_async(LastSeen.objects.record_many)(
        {target.pk: (T0 - timedelta(days=5)).timestamp()}
    )
    away = presence(last_seen_approx="within_week")
    watcher = await sockets.open(stranger)
    assert await subscribe(watcher, target) == state({target.pk: away})
    five_days = ["within_week"] * 5

    tab = await sockets.open(target)  # back at 09:30
    clock.shift(6400)  # 11:16:40
    await heartbeat(watcher)
    assert await shown(sockets, target, stranger) == five_days
    await sockets.close(tab)  # gone at 11:17 for good: the sweep persists it
    clock.shift(grace + 1)
    assert (await lifecycle.asweep()).offline == [target.pk]
    row = await sync_to_async(LastSeen.objects.get)(user=target)
    assert (row.seen_at, row.prior_seen_at) == (at(6400), T0 - timedelta(days=5))
    await assert_silent(watcher)  # failed before: {"last_seen_approx": null}
    assert await shown(sockets, target, stranger) == five_days  # failed before: None

    # Back in the afternoon by page views, then a logout: the same.
    clock.shift(3600)
    await api.atouch(target)
    clock.shift(60)
    await api.asign_off(target)
    clock.shift(grace + 1)
    await lifecycle.asweep()
    await heartbeat(watcher)
    await assert_silent(watcher)
    assert await shown(sockets, target, stranger) == five_days
    # presence_cleanup persists and removes what is stale; then Redis is flushed: the same.
    clock.shift(3 * 3600)
    await sync_to_async(call_command)("presence_cleanup", stdout=StringIO())
    await heartbeat(watcher)
    await assert_silent(watcher)
    assert await shown(sockets, target, stranger) == five_days
    await sync_to_async(forget_presence)(redis_client)
    assert await shown(sockets, target, stranger) == five_days

    # From midnight today's activity counts: one day ago.
    clock.move_to(datetime(T0.year, T0.month, T0.day, tzinfo=UTC) + timedelta(days=1))
    assert await shown(sockets, target, stranger) == ["recently"] * 5
