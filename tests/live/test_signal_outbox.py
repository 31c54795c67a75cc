"""The signals' outbox (presence.outbox): a transition whose caller never got the script's
reply (it gave up waiting for Redis, or its process was killed) is sent by the next sweep past
the deadline, once; a caller that got it sends it and the sweep nothing; racing claimers send
once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import api, domain, lifecycle, outbox, signals
from presence.conf import get_settings
from presence.store import get_store
from tests.clock import at
from tests.conftest import on_one_redis
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import new_user, presence_settings
from tests.live.test_signals import Sent, later, received, sent
from tests.privacy_cases import count_round_trips

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

__all__ = ["received"]


async def made_unheard(user: Any) -> Any:
    """The user's touch made in Redis, its reply lost (nobody sends or claims its signal)."""
    store = get_store()
    transition = await store.arun(store.plans.touch(user.pk, domain.Device.WEB, time.time()))
    assert transition is not None and transition.made == 1 and transition.entry
    return transition


async def outbox_size() -> int:
    store = get_store()
    return int(await store.arun(store.plans.outbox_size()))


async def test_a_transition_whose_caller_never_got_the_reply_is_sent_once_by_the_sweep(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    user = await new_user(make_user)
    await made_unheard(user)
    # Left to its caller until the deadline: no sweep sends it before.
    clock.shift(outbox.deadline() - 1)
    await lifecycle.asweep()
    assert await sent(received) == []
    clock.shift(1)
    await lifecycle.asweep()
    await lifecycle.asweep()
    assert await sent(received) == [("online", user.pk, at(0), False)]
    assert await outbox_size() == 0


async def test_presence_cleanup_sends_what_nobody_claimed(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    user = await new_user(make_user)
    await made_unheard(user)
    clock.shift(outbox.deadline())
    await sync_to_async(api.cleanup)()
    await sync_to_async(api.cleanup)()
    assert await sent(received) == [("online", user.pk, at(0), False)]


async def test_a_caller_that_got_the_reply_sends_once_and_the_sweep_nothing(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    user = await new_user(make_user)
    await api.atouch(user)
    assert await sent(received) == [("online", user.pk, at(0), False)]
    assert await outbox_size() == 0
    clock.shift(outbox.deadline())
    await lifecycle.asweep()
    assert await sent(received) == [("online", user.pk, at(0), False)]


async def test_a_caller_claiming_after_the_sweep_sent_it_sends_nothing(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    user = await new_user(make_user)
    transition = await made_unheard(user)
    clock.shift(outbox.deadline())
    await lifecycle.asweep()
    # The caller's claim comes late (its receivers' thread was busy): the sweep had it.
    outbox.send_made(transition)
    assert await sent(received) == [("online", user.pk, at(0), False)]


async def test_racing_claimers_send_once(
    make_user: Callable[..., Any], received: list[Sent]
) -> None:
    user = await new_user(make_user)
    transition = await made_unheard(user)
    store = get_store()
    start = threading.Barrier(4)  # within asyncio.to_thread's pool
    claims: list[bool] = []

    def claim() -> None:
        start.wait()
        claims.append(store.run(store.plans.claim_entry(user.pk, transition.entry)))

    await asyncio.gather(*(asyncio.to_thread(claim) for _ in range(4)))
    assert sorted(claims) == [False] * 3 + [True]
    # Callers that all sent what they were told: one signal.
    second = await made_unheard(await new_user(make_user))
    for _ in range(4):
        outbox.send_made(second)
    assert [kind for kind, *_ in await sent(received)] == ["online"]
    await asyncio.to_thread(signals.wait_sent)


async def test_the_entries_of_a_sweeps_transitions_are_claimed_together_and_sent_once(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    users = [await new_user(make_user) for _ in range(4)]
    made = [await made_unheard(user) for user in users]
    late = made.pop()  # another party (a sweep) claimed this one: its claim below finds nothing
    store = get_store()
    assert await store.arun(store.plans.claim_entry(users[-1].pk, late.entry))
    with count_round_trips() as trips:
        # A merged plan's replies (one of them None), one transition listed twice: won once.
        outbox.send_made([*made, None, late, made[0]])
        await asyncio.to_thread(signals.wait_sent)
    assert [trip for trip in trips.commands if "ZREM" in trip] == [["ZREM"] * 5]
    assert sorted(await sent(received)) == sorted(
        ("online", user.pk, at(0), False) for user in users[:-1]
    )
    assert await outbox_size() == 0
    # Told again (a retried reply): nothing more is sent, whoever claims.
    received.clear()
    outbox.send_made(made)
    assert await sent(received) == []


async def test_a_user_back_before_anyone_made_their_offline_gets_both_signals_in_order(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    # A site without live processes: nobody swept between the user's leaving (the online
    # window passed; every reader showed them offline) and their next page view.
    window = get_settings().ONLINE_WINDOW
    user = await new_user(make_user)
    await api.atouch(user)
    await later(clock, window + 120)
    await api.atouch(user)
    expected = [
        ("online", user.pk, at(0), False),
        ("offline", user.pk, at(window), False),
        ("online", user.pk, at(window + 120), False),
    ]
    assert await sent(received) == expected
    assert await outbox_size() == 0
    # The cleanup (cron) and a sweep after it find nothing more to send.
    await later(clock, 60)
    await sync_to_async(api.cleanup)()
    await later(clock, outbox.deadline())
    await lifecycle.asweep()
    assert await sent(received) == expected


@on_one_redis
async def test_a_claim_answered_late_waits_for_its_reply_and_sends_once(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
    redis_client: Any,
) -> None:
    # Redis busy past a page's SOCKET_TIMEOUT (another client's long command) when the caller
    # claims: Redis removes the entry once it is free, so a claimer that gave up on the reply
    # (taken for "not mine") would leave the transition to nobody. The claim waits as the
    # write did (LIVE_SOCKET_TIMEOUT).
    with presence_settings(SOCKET_TIMEOUT=0.5, LIVE_SOCKET_TIMEOUT=5):
        user = await new_user(make_user)
        transition = await made_unheard(user)
        redis_client.client_pause(800)
        outbox.send_made(transition)
        assert await sent(received) == [("online", user.pk, at(0), False)]
        assert await outbox_size() == 0
        clock.shift(outbox.deadline())
        await lifecycle.asweep()
        assert await sent(received) == [("online", user.pk, at(0), False)]
