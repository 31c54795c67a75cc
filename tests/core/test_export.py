"""A user's data: api.export_user_data / aexport_user_data and ``manage.py presence_export``,
by exact keys and values for a user with privacy settings, an exception, contacts both ways,
a block, a custom status, a live connection and a room; other users' choices about them left
out; the command's JSON, its lookup by pk or username, and its errors."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command

from presence import api, lifecycle
from presence.models import Block, Contact, LastSeen, PrivacyException, PrivacySettings
from presence.store import get_store
from tests.clock import T0, at
from tests.store.stores import down_store as down_store

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]


def iso(seconds: float) -> str:
    return at(seconds).isoformat()


def wire(pk: Any) -> Any:
    return pk if isinstance(pk, int) else str(pk)


def other(user: Any) -> dict[str, Any]:
    return {"user": wire(user.pk), "name": api.display_name(user)}


@pytest.fixture
def people(
    make_user: Callable[..., Any],
    settings: Any,
    clock: time_machine.Coordinates,
    django_capture_on_commit_callbacks: Any,
) -> Any:
    """Alice with a bit of everything; Bob, Carol and Dave around her."""
    settings.PRESENCE = {"ROOMS": {"lobby": None}}
    alice, bob, carol, dave = (make_user() for _ in range(4))
    PrivacySettings.objects.create(
        user=alice,
        online_visibility="everyone",
        last_seen_visibility="contacts",
        activity_visibility="nobody",
    )
    PrivacyException.objects.create(
        owner=alice, viewer=bob, setting="last_seen_visibility", allow=True
    )
    Contact.objects.create(owner=alice, contact=bob, close_friend=True)
    Contact.objects.create(owner=bob, contact=alice)
    Contact.objects.create(owner=carol, contact=alice, close_friend=True)
    Block.objects.create(blocker=alice, blocked=dave)
    # Other users' privacy choices about Alice: not hers to see.
    Block.objects.create(blocker=carol, blocked=bob)
    PrivacyException.objects.create(
        owner=carol, viewer=alice, setting="online_visibility", allow=False
    )
    PrivacySettings.objects.create(user=dave, invisible=True)
    LastSeen.objects.create(user=alice, seen_at=at(-3600), prior_seen_at=at(-86400))
    with django_capture_on_commit_callbacks(execute=True):  # (Redis's copy: after commit)
        api.set_status(alice, "dnd", text="Focus", emoji="🎧", expires_at=at(3600))
    async_to_sync(lifecycle.aconnect)(alice, "c0ffee0000000001", "mobile")
    api.touch(bob)  # someone else online: nothing of Bob's state is in Alice's export
    store = get_store()
    store.run(
        store.plans.join_room("lobby:1", alice.pk, "c0ffee0000000001", T0.timestamp(), '{"a":1}')
    )
    store.run(store.plans.join_room("lobby:2", bob.pk, "b0b0000000000001", T0.timestamp()))
    return alice, bob, carol, dave


def expected(alice: Any, bob: Any, carol: Any, dave: Any) -> dict[str, Any]:
    added_by = sorted([bob, carol], key=lambda u: u.pk)
    return {
        "user": wire(alice.pk),
        "privacy": {
            "online_visibility": "everyone",
            "last_seen_visibility": "contacts",
            "activity_visibility": "nobody",
            "invisible": False,
            "saved": True,
        },
        "exceptions": [{**other(bob), "setting": "last_seen_visibility", "allow": True}],
        "contacts": {
            "added": [{**other(bob), "close_friend": True, "at": iso(0)}],
            # who added her, without their close-friend choice
            "added_by": [{**other(u), "at": iso(0)} for u in added_by],
        },
        "blocks": [{**other(dave), "at": iso(0)}],
        "last_seen": {"latest": iso(0), "saved": iso(-3600), "saved_before_today": iso(-86400)},
        "status": {
            "status": "dnd",
            "invisible": False,
            "dnd": True,
            "text": "Focus",
            "emoji": "🎧",
            "activity": None,
            "expires_at": iso(3600),
            "updated_at": iso(0),
        },
        "rooms": [{"room": "lobby:1", "joined_at": iso(0), "meta": {"a": 1}, "invisible": False}],
        "redis": {
            "live": {
                "last_active": iso(0),
                "devices": ["mobile"],
                "connected": True,
                "idle": False,
                "signed_off": False,
            },
            "last_seen_before_today": None,
            "connections": [
                {
                    "device": "mobile",
                    "idle": False,
                    "connected_at": iso(0),
                    "last_heartbeat": iso(0),
                }
            ],
            "page_views_while_connected": [],
            "offline_due_at": iso(1 + 90),  # the end of CONNECTION_TTL after the heartbeat's second
            "online_ledger": {"as": "online", "until": iso(1 + 90)},
            "invisible": False,
            "status_expires_at": iso(3601),  # the schedule's whole second, past the expiry
        },
    }


def test_the_export_holds_everything_of_hers_and_nothing_of_others(people: Any) -> None:
    alice = people[0]
    exported = api.export_user_data(alice)
    assert exported == expected(*people)
    assert json.loads(json.dumps(exported)) == exported  # JSON-ready as it is
    assert api.export_user_data(alice.pk) == exported  # an id does as well as the user


@pytest.mark.django_db(transaction=True)
async def test_the_async_twin(people: Any, close_async_db_connections: Any) -> None:
    assert await api.aexport_user_data(people[0]) == expected(*people)


def test_a_user_presence_never_saw(make_user: Callable[..., Any], settings: Any) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": {"online_visibility": "everyone"}}
    quiet = make_user()
    assert api.export_user_data(quiet) == {
        "user": wire(quiet.pk),
        "privacy": {
            "online_visibility": "everyone",  # the site's defaults, never chosen
            "last_seen_visibility": "contacts",
            "activity_visibility": "contacts",
            "invisible": False,
            "saved": False,
        },
        "exceptions": [],
        "contacts": {"added": [], "added_by": []},
        "blocks": [],
        "last_seen": {"latest": None, "saved": None, "saved_before_today": None},
        "status": {
            "status": "offline",
            "invisible": False,
            "dnd": False,
            "text": None,
            "emoji": None,
            "activity": None,
            "expires_at": None,
            "updated_at": None,
        },
        "rooms": [],
        "redis": {
            "live": None,
            "last_seen_before_today": None,
            "connections": [],
            "page_views_while_connected": [],
            "offline_due_at": None,
            "online_ledger": None,
            "invisible": False,
            "status_expires_at": None,
        },
    }


def test_the_command_prints_the_export_as_json(people: Any) -> None:
    alice = people[0]
    for name in (str(alice.pk), alice.get_username()):
        out = io.StringIO()
        call_command("presence_export", name, stdout=out)
        # With the activity feed installed (these tests' site), its part too: she has none.
        feed = {"activities": [], "memberships": [], "mentions": []}
        assert json.loads(out.getvalue()) == {**expected(*people), "feed": feed}


def test_the_command_refuses_an_unknown_user_clearly(make_user: Callable[..., Any]) -> None:
    make_user()
    for name in ("nobody", "999999", "0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10"):
        with pytest.raises(CommandError) as refused:
            call_command("presence_export", name, stdout=io.StringIO())
        assert str(refused.value) == f"No user has the pk or the username {name!r}."


def test_the_command_exports_nothing_half_while_redis_is_down(
    make_user: Callable[..., Any], down_store: Any
) -> None:
    user = make_user()
    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("presence_export", str(user.pk), stdout=out)
    assert "Redis is unavailable" in str(refused.value)
    assert str(refused.value).endswith("Nothing was exported; try again.")
    assert out.getvalue() == ""


def test_status_expiry_and_invisibility_show_as_held(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    django_capture_on_commit_callbacks: Any,
) -> None:
    user = make_user()
    api.touch(user)
    with django_capture_on_commit_callbacks(execute=True):  # (Redis's copy: after commit)
        api.set_status(user, "invisible", text="away", expires_at=at(600))
    clock.shift(timedelta(minutes=1).total_seconds())
    exported = api.export_user_data(user)
    assert exported["status"]["status"] == "online"  # as she sees herself
    assert exported["status"]["invisible"] is True
    assert exported["privacy"]["invisible"] is True
    assert exported["redis"]["invisible"] is True
    assert exported["redis"]["online_ledger"] == {"as": "hidden", "until": iso(300)}
