"""Recording activity: a request's touch, a logout's sign-off."""

from __future__ import annotations

from typing import Any

from presence import announce, domain, outbox, resolution
from presence.models import LastSeen
from presence.operations import Operation, arun, call, redis_then, run
from presence.store import get_store
from presence.users import user_pk as _pk


def _touch(user: Any, device: str) -> Operation[None]:
    user_id = _pk(user)
    now = resolution.now()
    store = get_store()
    # Its signal is sent even if the caller is cancelled meanwhile (see presence.outbox).
    transition = yield from redis_then(
        store.plans.touch(user_id, domain.Device(device), now), outbox.send_made
    )
    if resolution.is_news(transition, now):
        yield from call(
            announce.announce_change,
            [user_id],
            domain.LIVE_CHANGE,
            afunction=announce.aannounce_change,
        )


def touch(user: Any, device: str = "web") -> None:
    """Record activity of ``user`` now. Never raises for a Redis outage (it is logged).

    A user coming online is announced to open connections (once per online stretch)."""
    run(_touch(user, device))


async def atouch(user: Any, device: str = "web") -> None:
    await arun(_touch(user, device))


def _sign_off(user: Any, device: str) -> Operation[None]:
    user_id = _pk(user)
    now = resolution.now()
    store = get_store()
    yield from redis_then(
        store.plans.sign_off(user_id, domain.Device(device), now), outbox.send_made
    )
    yield from call(LastSeen.objects.record_many, {user_id: now})


def sign_off(user: Any, device: str = "web") -> None:
    """The user left on ``device`` (logout): persist last seen; offline once no device is left."""
    run(_sign_off(user, device))


async def asign_off(user: Any, device: str = "web") -> None:
    await arun(_sign_off(user, device))
