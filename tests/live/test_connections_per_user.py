"""The WebSocket consumer at ws/presence/: connections per user (MAX_CONNECTIONS_PER_USER).

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from django.apps import apps

from presence import api, domain
from presence.conf import get_settings
from presence.models import Contact, LastSeen, PrivacySettings
from presence.store import get_store
from tests.clock import at
from tests.ids import redis_member
from tests.live.sockets import (
    HIDDEN,
    Sockets,
    assert_silent,
    connections_in_redis,
    diff,
    heartbeat,
    lets_see,
    new_user,
    online,
    presence_settings,
    receive,
    refused,
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


# --- connections per user (MAX_CONNECTIONS_PER_USER) ------------------------------------------


async def redis_trace(user: Any) -> dict[str, Any]:
    """Everything Redis holds about a user's presence: their seen score, the fields and members
    of their connections in the bucket, their due time."""
    store = get_store()
    client = store.async_client
    bucket = store.keys.bucket_of(user.pk)
    fields = await client.hgetall(store.keys.conns_key(bucket))
    members = await client.zrange(store.keys.expiries_key(bucket), 0, -1)
    member = redis_member(user)
    mine = f"{member}:"
    return {
        "seen": await client.zscore(store.keys.seen_key(bucket), member),
        "fields": {k: v for k, v in fields.items() if k == member or k.startswith(mine)},
        "members": [m for m in members if m.startswith(mine)],
        "due": await client.zscore(store.keys.user_due_key(user.pk), member),
    }


async def test_a_connection_past_the_limit_is_closed_with_4429_and_leaves_no_trace(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(MAX_CONNECTIONS_PER_USER=3):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
        tabs = [await sockets.open(target)]
        assert await receive(watcher) == diff({target.pk: online()})
        clock.shift(10)
        tabs += [await sockets.open(target), await sockets.open(target)]
        assert len(await connections_in_redis(target)) == 3
        before = await redis_trace(target)

        clock.shift(5)
        assert await refused(sockets.make(target, "?device=mobile"))
        # Nothing recorded: no connection, no device, no newer activity, no due time moved...
        assert await redis_trace(target) == before
        # ... and nothing announced.
        await assert_silent(watcher)
        # The open ones are untouched and keep working.
        await heartbeat(tabs[0], "idle")
        assert len(await connections_in_redis(target)) == 3

        # Once one closes, there is room again.
        await sockets.close(tabs[1])
        phone = await sockets.open(target, "?device=mobile")
        assert await receive(watcher) == diff({target.pk: online(15, devices=("web", "mobile"))})
        assert len(await connections_in_redis(target)) == 3
        await heartbeat(phone)


async def test_connections_of_other_processes_count_and_only_live_ones(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ttl = get_settings().CONNECTION_TTL
    with presence_settings(MAX_CONNECTIONS_PER_USER=2):
        user = await new_user(make_user)
        store = get_store()
        # Two connections recorded by another process (the store is all processes share).
        for connection_id in ("other1", "other2"):
            opened = await store.arun(
                store.plans.connection(user.pk, "open", at(0).timestamp(), connection_id)
            )
            assert opened is not None and not opened.refused
        assert await refused(sockets.make(user))
        clock.shift(ttl)
        assert await refused(sockets.make(user))
        # The other process crashed: its connections are gone a full CONNECTION_TTL after
        # their heartbeat's second, and count no more (even before a sweep drops them).
        clock.shift(1)
        await sockets.open(user)
        assert len(await connections_in_redis(user)) == 1


async def test_heartbeats_that_change_nothing_are_written_at_most_every_half_interval(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    interval = get_settings().HEARTBEAT_INTERVAL
    user = await new_user(make_user)
    tab = await sockets.open(user)

    async def last_written() -> int:
        (entry,) = await connections_in_redis(user)
        return int(entry.split(":")[4]) - int(at(0).timestamp())

    async def seen() -> float | None:
        store = get_store()
        key = store.keys.seen_key(store.keys.bucket_of(user.pk))
        return await store.async_client.zscore(key, redis_member(user))

    before = await seen()
    clock.shift(interval / 2 - 1)
    await heartbeat(tab)  # a client beating too often: nothing to write
    assert await last_written() == 0
    assert await seen() == before
    await heartbeat(tab, "idle")  # a change is written at once
    assert await last_written() == interval / 2 - 1
    assert (await api.aget_presence(user, user)).status == "idle"
    clock.shift(interval / 2 - 1)
    await heartbeat(tab, "idle")
    assert await last_written() == interval / 2 - 1
    clock.shift(1)  # half an interval since the last write
    await heartbeat(tab, "idle")
    assert await last_written() == interval - 1
    # The skipped beats never made the connection look dead: due when its last write expires.
    store = get_store()
    assert await store.async_client.zscore(
        store.keys.user_due_key(user.pk), redis_member(user)
    ) == (at(interval - 1).timestamp() + 1 + get_settings().CONNECTION_TTL)


async def test_a_heartbeat_after_the_clock_stepped_back_is_written(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # NTP steps the clock an hour back: the connection is recorded by the clock as it reads
    # now, so that a crash is found CONNECTION_TTL after its last heartbeat, not an hour later.
    user = await new_user(make_user)
    tab = await sockets.open(user)
    clock.shift(-3600)
    await heartbeat(tab)
    (entry,) = await connections_in_redis(user)
    assert int(entry.split(":")[4]) - int(at(0).timestamp()) == -3600
    store = get_store()
    assert await store.async_client.zscore(
        store.keys.user_due_key(user.pk), redis_member(user)
    ) == (at(-3600).timestamp() + 1 + get_settings().CONNECTION_TTL)


async def test_a_heartbeat_that_changes_nothing_is_not_even_parsed(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Most frames a process handles are heartbeats within half an interval of the last
    write: known spellings of them are handled on arrival (no parse, no handler), and the
    frames that do something still reach the handler."""
    user = await new_user(make_user)
    tab = await sockets.open(user)
    parsed: list[str | None] = []
    parse = domain.parse_frame

    def counting(text: str | None, *args: Any, **kwargs: Any) -> Any:
        parsed.append(text)
        return parse(text, *args, **kwargs)

    monkeypatch.setattr(domain, "parse_frame", counting)
    clock.shift(1)
    await tab.send_to(text_data='{"type":"heartbeat","state":"active"}')  # presence.js
    await heartbeat(tab)  # json.dumps' spelling; then an answered subscribe
    assert [json.loads(text or "")["type"] for text in parsed] == ["subscribe"]
    parsed.clear()
    await heartbeat(tab, "idle")  # a change: parsed, handled and written
    assert [json.loads(text or "")["type"] for text in parsed] == ["heartbeat", "subscribe"]
    assert (await api.aget_presence(user, user)).status == "idle"
    parsed.clear()
    await tab.send_to(text_data='{"state":"idle","type":"heartbeat"}')  # another spelling
    await heartbeat(tab, "idle")
    assert [json.loads(text or "")["type"] for text in parsed] == ["heartbeat", "subscribe"]


async def test_a_sites_own_graph_kept_in_sync_by_the_recipe_reaches_open_sockets(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """tests.sites.graphsite's Follow model with the receivers of docs/api.md: following there is
    following in presence, and an open socket sees it at once."""
    if not apps.is_installed("tests.sites.graphsite"):
        pytest.skip("tests.sites.graphsite is not installed in this settings variant")
    from tests.sites.graphsite.models import Follow

    viewer, target = await new_user(make_user), await new_user(make_user)
    await sockets.open(target)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    follow = await sync_to_async(Follow.objects.create)(follower=target, followed=viewer)
    assert await sync_to_async(Contact.objects.filter(owner=target, contact=viewer).exists)()
    assert await receive(watcher) == diff({target.pk: online()})
    await sync_to_async(follow.delete)()
    assert await receive(watcher) == diff({target.pk: HIDDEN})


async def test_one_time_format_on_every_path(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """last_seen from the database keeps microseconds, from Redis whole seconds: the JSON
    endpoint, the WebSocket and the feed's created_at all say it one way (domain.iso_time)."""
    from django.test import AsyncClient

    from presence.feed import api as feed

    viewer, target = await new_user(make_user), await new_user(make_user)
    await sync_to_async(PrivacySettings.objects.create)(
        user=target, online_visibility="everyone", last_seen_visibility="everyone"
    )
    seen = datetime(2030, 1, 7, 9, 30, 0, 123456, tzinfo=UTC)
    await sync_to_async(LastSeen.objects.create)(user=target, seen_at=seen)
    watcher = await sockets.open(viewer)
    over_socket = (await subscribe(watcher, target))["presences"][str(target.pk)]["last_seen"]
    client = AsyncClient()
    await sync_to_async(client.force_login)(viewer)
    over_http = (await client.get(f"/presence/api/presence?users={target.pk}")).json()
    assert over_socket == over_http["presences"][str(target.pk)]["last_seen"]
    assert over_socket == "2030-01-07T09:30:00+00:00"
    activity = await sync_to_async(feed.post)(target, "Hello")
    created = (await sync_to_async(feed.activity_as_dict)(activity))["created_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", created)
