"""presence.hub.recovery: a process behind its channel resolves every watched user again once,
when it has caught up (announcements within CAUGHT_UP of the limit again, or none for a sweep
interval), not each time the lag dips under the limit (in a reconnect storm it swings about it,
and each resync of every watched user kept the process behind)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import time_machine

from presence.domain import Device
from presence.hub import Hub
from presence.hub.recovery import CAUGHT_UP, RELAPSE, Recovery
from presence.hub.registry import Registry
from presence.store import get_store
from tests.live.sockets import (
    HIDDEN,
    Sockets,
    announced_about,
    assert_silent,
    diff,
    lets_see,
    new_user,
    online,
    presence_settings,
    receive,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [pytest.mark.usefixtures("close_async_db_connections")]


async def test_a_process_still_far_behind_resyncs_only_once_it_has_caught_up(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(SWEEP_INTERVAL=0.1):
        viewer, target, other = [await new_user(make_user) for _ in range(3)]
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
        hub = Hub.current()
        assert hub is not None and not hub.recovery.behind
        # The target comes online without an announcement (one the layer dropped).
        store = get_store()
        await store.arun(store.plans.touch(target.pk, Device.WEB, time.time()))
        announced_about(hub, other, time.time() - hub.behind_after())
        assert hub.recovery.behind
        # Later announcements under the limit but still far behind, more often than the
        # sweep looks: not caught up, for several sweep intervals.
        still_far = hub.behind_after() * (CAUGHT_UP + 0.5)
        for _ in range(10):
            announced_about(hub, other, time.time() - still_far)
            assert await watcher.receive_nothing(timeout=0.04)
            assert hub.recovery.behind
        # On time again: within a sweep interval every watched user is resolved again.
        announced_about(hub, other, time.time() - hub.behind_after() * CAUGHT_UP / 2)
        assert await receive(watcher) == diff({target.pk: online()})
        assert not hub.recovery.behind
        await assert_silent(watcher)


async def test_a_process_behind_again_soon_after_its_resync_waits_for_a_longer_quiet() -> None:
    # Its loop, too busy to read the channel for a sweep interval, looked caught up: each such
    # relapse doubles the quiet the next catch-up waits for.
    resyncs: list[list[int]] = []
    recovery = Recovery(SimpleNamespace(expiry=60), Registry(), None, resyncs.append)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    with presence_settings(SWEEP_INTERVAL=1):
        for quiet in (1, 2, 4):
            recovery.note_lag(time.time() - 15)
            assert recovery.behind
            late = loop.time()
            recovery.after_lag(late + quiet - 0.1)
            assert len(resyncs) == quiet.bit_length() - 1
            recovery.after_lag(late + quiet)
            assert len(resyncs) == quiet.bit_length()
            assert not recovery.behind
        # Behind again long after its last resync: a sweep interval's quiet is enough again.
        recovery._resynced_at = loop.time() - RELAPSE
        recovery.note_lag(time.time() - 15)
        recovery.after_lag(loop.time() + 1)
        assert len(resyncs) == 4
