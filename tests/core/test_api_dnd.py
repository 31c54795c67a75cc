"""presence.api's ``set_dnd`` / ``aset_dnd``: do not disturb alone, on and off. A site's "do not
disturb while in a match" must keep a user who chose to be invisible invisible (the documented
``set_status(user, "dnd", ...)`` recipe made them visible and lost their choice) and keep the
custom status; saved through the model, so open sockets follow after commit, nothing when the
transaction rolls back."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from presence import api
from presence.domain import InvalidInput, Status
from presence.models import Contact, PrivacySettings, UserStatus
from presence.store import get_store
from tests.live.sockets import sockets as sockets

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]

UNKNOWN_ID = 987_654_321


def _friends(user: Any, friend: Any) -> None:
    Contact.objects.create(owner=user, contact=friend)
    Contact.objects.create(owner=friend, contact=user)


@pytest.mark.django_db(transaction=True)
def test_set_dnd_keeps_an_invisible_user_invisible_and_their_custom_status(
    make_user: Callable[..., Any], clock: Any
) -> None:
    user, friend = make_user(), make_user()
    _friends(user, friend)
    PrivacySettings.objects.create(user=user, activity_visibility="everyone")
    api.set_status(user, "auto", text="Ranked", emoji="🎮", activity="In the lobby")
    api.touch(user)
    assert api.set_invisible(user, True) is True

    assert api.set_dnd(user, True) is True
    assert api.set_dnd(user, True) is False
    own = api.get_presence(user, user)
    assert (own.status, own.invisible) == (Status.DND, True)
    assert (own.text, own.emoji, own.activity) == ("Ranked", "🎮", "In the lobby")
    assert api.get_presence(user, friend).status is Status.OFFLINE
    assert PrivacySettings.objects.get(user=user).invisible is True
    # Redis's copy: still left out of the online count.
    assert get_store().run(get_store().plans.invisible_members()) == {user.pk}
    assert api.online_count() == 0

    assert api.set_dnd(user, False) is True
    own = api.get_presence(user, user)
    assert (own.status, own.invisible, own.text) == (Status.ONLINE, True, "Ranked")
    assert api.get_presence(user, friend).status is Status.OFFLINE
    assert api.online_count() == 0

    # Turning invisible off later shows what the user chose meanwhile.
    api.set_dnd(user, True)
    api.set_invisible(user, False)
    assert api.get_presence(user, friend).status is Status.DND
    assert api.get_presence(user, friend).activity == "In the lobby"


@pytest.mark.django_db
def test_set_dnd_keeps_the_custom_status_and_its_end(
    make_user: Callable[..., Any], clock: Any
) -> None:
    user = make_user()
    ends = timezone.now() + timedelta(hours=1)
    api.set_status(user, "auto", text="Focus", emoji="🎧", expires_at=ends)
    assert api.set_dnd(user.pk, True) is True
    row = UserStatus.objects.get(user=user)
    assert (row.dnd, row.text, row.emoji, row.expires_at) == (True, "Focus", "🎧", ends)
    assert api.set_dnd(user, False) is True
    assert UserStatus.objects.get(user=user).dnd is False


@pytest.mark.django_db
def test_set_dnd_answers_whether_it_changed_anything_and_refuses_bad_input(
    make_user: Callable[..., Any],
) -> None:
    user = make_user()
    # No row: not dnd already, and no row is made for it.
    assert api.set_dnd(user, False) is False
    assert not UserStatus.objects.exists()
    with pytest.raises(InvalidInput) as raised:
        api.set_dnd(user, "yes")  # type: ignore[arg-type]
    assert (raised.value.code, "dnd" in raised.value.message) == ("invalid_value", True)
    with pytest.raises(InvalidInput) as raised:
        api.set_dnd(UNKNOWN_ID, True)
    assert raised.value.code == "unknown_users"
    assert not UserStatus.objects.exists()
    assert not PrivacySettings.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_set_dnd_rolled_back_changes_nothing(make_user: Callable[..., Any], clock: Any) -> None:
    user, friend = make_user(), make_user()
    _friends(user, friend)
    api.touch(user)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert api.set_dnd(user, True) is True
        raise RuntimeError("the site's view failed")
    assert not UserStatus.objects.exists()
    assert api.get_presence(user, friend).status is Status.ONLINE


# --- the async twin, told on open sockets -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_aset_dnd_reaches_friends_of_a_visible_user_and_none_of_an_invisible_one(
    sockets: Any, settings: Any, make_user: Callable[..., Any]
) -> None:
    from tests.live.sockets import BASE, assert_silent, receive, subscribe

    settings.PRESENCE = dict(BASE)
    alice, carol = await sync_to_async(make_user)(), await sync_to_async(make_user)()

    @sync_to_async
    def arrange() -> None:
        _friends(alice, carol)
        PrivacySettings.objects.create(user=alice, activity_visibility="everyone")
        api.set_status(alice, "auto", activity="In the lobby")

    await arrange()
    await sockets.open(alice)
    carol_tab = await sockets.open(carol)
    seen = (await subscribe(carol_tab, alice))["presences"][str(alice.pk)]
    assert (seen["status"], seen["activity"]) == ("online", "In the lobby")

    assert await api.aset_dnd(alice, True) is True
    changed = (await receive(carol_tab))["presences"][str(alice.pk)]
    assert (changed["status"], changed["activity"]) == ("dnd", "In the lobby")
    assert await api.aset_dnd(alice, False) is True
    changed = (await receive(carol_tab))["presences"][str(alice.pk)]
    assert changed["status"] == "online"

    assert await api.aset_invisible(alice, True) is True
    assert (await receive(carol_tab))["presences"][str(alice.pk)]["status"] == "offline"
    # Invisible: a match's do not disturb, on and off, shows carol nothing of alice.
    assert await api.aset_dnd(alice, True) is True
    assert await api.aset_dnd(alice, False) is True
    await assert_silent(carol_tab)
    assert (await api.aget_presence(alice, carol)).status is Status.OFFLINE
    own = await api.aget_presence(alice, alice)
    assert (own.invisible, own.activity) == (True, "In the lobby")


@pytest.mark.django_db(transaction=True)
def test_the_documented_match_recipe_keeps_invisibility(
    make_user: Callable[..., Any], clock: Any
) -> None:
    """docs/api.md's "a match's activity with do not disturb", as written there."""
    user, friend = make_user(), make_user()
    _friends(user, friend)
    PrivacySettings.objects.create(user=user, activity_visibility="everyone")
    api.set_status(user, "auto", emoji="🎮")
    api.touch(user)
    for invisible in (True, False):
        api.set_invisible(user, invisible)
        with transaction.atomic():
            own = api.get_presence(user, user)
            mode = "invisible" if own.invisible else "auto"
            api.set_status(user, mode, own.text, own.emoji, "In a match", own.expires_at)
            api.set_dnd(user, True)
        own = api.get_presence(user, user)
        assert (own.status, own.invisible, own.emoji, own.activity) == (
            Status.DND,
            invisible,
            "🎮",
            "In a match",
        )
        seen = api.get_presence(user, friend).status
        assert seen is (Status.OFFLINE if invisible else Status.DND)
