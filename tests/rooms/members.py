"""Putting users in a room for the read paths' tests (HTTP, template tag): the user is seen now
(``api.touch``, so the resolver shows them online to whoever may see it) and one connection of
theirs joins through the store's own join plan, as the consumer's join does."""

from __future__ import annotations

import io
import json
import time
from typing import Any

from presence import api
from presence.store import get_store
from presence.store.keys import ROOM_Z_KEEP


def claimed(result: Any) -> Any:
    """``result`` (a room write or sweep, or a list of them), once the outbox entries of the
    transitions it made are claimed, as the callers in presence.rooms.writes do (without
    sending their signals): a test of the store alone leaves no entry behind."""
    store = get_store()
    for each in result if isinstance(result, list) else [result]:
        for transition in getattr(each, "made", ()):
            if transition.entry is not None:
                store.run(store.plans.claim_room_entry(transition.room, transition.entry))
    return result


def enter(
    user: Any, room: str, meta: dict[str, Any] | None = None, invisible: bool = False
) -> None:
    """``user`` online and in ``room``, its flag ``invisible`` (a socket's join writes its
    user's choice: the counts follow the flag)."""
    api.touch(user)
    store = get_store()
    text = None if meta is None else json.dumps(meta, separators=(",", ":"))
    plan = store.plans.join_room(
        room, user.pk, f"conn-{user.pk}", time.time(), meta=text, invisible=invisible
    )
    assert store.run(plan) is not None


def lasting_room_keys(redis_client: Any, match: str = "*room*") -> list[str]:
    """The room keys matching ``match`` that stay: every one but an emptied room's kept ``z``
    (``:z``), which must expire by itself within ROOM_Z_KEEP seconds."""
    lasting = []
    for key in redis_client.scan_iter(match, count=1000):
        if key.endswith(":z") and ":{room:" in key:
            assert 0 < redis_client.ttl(key) <= ROOM_Z_KEEP, key
            continue
        lasting.append(key)
    return lasting


def no_room_key_left_once_leaves_are_past(redis_client: Any) -> bool:
    """Whether no room key is left once a cleanup ran past the outbox deadline of the leaves
    the last one made: a room emptied by a sweep stays due until then (the outbox holds its
    batch of leaves until claimed: lua/room_common.lua), and that cleanup takes it out of its
    schedule."""
    import time_machine
    from django.core.management import call_command

    from presence import outbox

    with time_machine.travel(time.time() + outbox.deadline() + 1, tick=False):
        call_command("presence_cleanup", stdout=io.StringIO())
    return lasting_room_keys(redis_client) == []
