"""A transition nobody claimed from the outbox (presence.outbox) was announced by nobody either:
its caller never learnt it made it (a page that gave up on a slow Redis, which ran the write
later; a process killed). The sweep or ``presence_cleanup`` that claims it past the deadline
tells the open sockets watching the user, and stamps the change, as its caller would have.

Real sockets (WebsocketCommunicator) on the real channel layer and Redis; helpers:
tests/live/sockets.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import api, domain, lifecycle, outbox
from presence.domain import Kind
from presence.store import get_store
from tests.ids import wire_id
from tests.live.sockets import (
    Sockets,
    assert_silent,
    diff,
    lets_see,
    new_user,
    online,
    receive,
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


async def made_unheard(user: Any) -> None:
    """The user's page view written, its reply never read (as a page that gave up waiting for
    a slow Redis which ran it later): nobody claimed its signal or announced it."""
    store = get_store()
    transition = await store.arun(store.plans.touch(user.pk, domain.Device.WEB, time.time()))
    assert transition is not None and transition.made == 1 and transition.entry


async def claim_by_sweep() -> None:
    await lifecycle.asweep()


async def claim_by_cleanup() -> None:
    await sync_to_async(api.cleanup)()


@pytest.mark.parametrize("claim", [claim_by_sweep, claim_by_cleanup], ids=["sweep", "cleanup"])
async def test_a_transition_nobody_claimed_is_announced_by_whoever_claims_it(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    claim: Callable[[], Any],
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    snapshot = await subscribe(watcher, target)
    assert snapshot["presences"][str(wire_id(target))]["status"] == "offline"

    await made_unheard(target)
    await assert_silent(watcher)

    clock.shift(outbox.deadline())
    await claim()
    assert await receive(watcher) == diff({target.pk: online(0)})


async def test_the_change_is_stamped_for_pages_rendered_before(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # A page rendered while the user was offline is told at its socket's stamped subscribe.
    viewer, target = await new_user(make_user), await new_user(make_user)
    await made_unheard(target)
    clock.shift(outbox.deadline())
    rendered = time.time()
    clock.shift(1)
    await lifecycle.asweep()

    store = get_store()
    found = await store.arun(
        store.plans.changed_since([target.pk], viewer.pk, rendered, rendered), live=True
    )
    assert found is not None and found[1] == {target.pk: Kind.LIVE}
