"""A change a viewer may not see is not told to them at all (presence.domain.Change.seen_by).

A blocked viewer, or a stranger to a user who shares with contacts only, must learn nothing of
what the user does: not by being sent their (unchanged) hidden presence again when they come
online, change a status or go invisible, when they follow or block someone else, nor when they
change their privacy in a way that leaves the viewer seeing as little as before. Two paths
carry such news: the answer to a stamped subscribe (a page's socket, a resume), which lists a
user who changed since the stamp apart from the ``unchanged``; and the live diffs to a socket
whose view of a user is the page's (left out of its snapshot as unchanged), where the hub does
not hold what the viewer was last shown. Each is asked here with a change and without one: the
answers are the same. A viewer who may see the change is still told (the rule is not a gag).

Helpers: tests/live/sockets.py, tests/live/test_stamped_subscribe.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from presence import api
from presence.models import Block, Contact, PrivacyException, PrivacySettings
from tests.ids import wire_id
from tests.live.sockets import TIMEOUT, Sockets, lets_see, new_user
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.live.test_stamped_subscribe import ids, render_page, resolved, subscribe_since

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]


async def _online(target: Any, other: Any) -> None:
    await api.atouch(target)


async def _status(target: Any, other: Any) -> None:
    await sync_to_async(api.set_status)(target, "dnd", text="in a meeting", emoji="📅")


async def _invisible(target: Any, other: Any) -> None:
    await sync_to_async(api.set_status)(target, "invisible")


async def _follows_someone_else(target: Any, other: Any) -> None:
    await sync_to_async(Contact.objects.create)(owner=target, contact=other)


async def _blocks_someone_else(target: Any, other: Any) -> None:
    await sync_to_async(Block.objects.create)(blocker=target, blocked=other)


@sync_to_async
def _shares_with_close_friends_only(target: Any, other: Any) -> None:
    # Contacts lose the online status: strangers and a blocked viewer saw nothing before.
    settings = PrivacySettings.objects.get(user=target)
    settings.online_visibility = settings.activity_visibility = "close_friends"
    settings.save()


@sync_to_async
def _saves_settings_built_by_hand(target: Any, other: Any) -> None:
    # An instance never read from the database, saved over the row: what the row said before
    # is read at the save.
    PrivacySettings(
        user=target,
        online_visibility="nobody",
        last_seen_visibility="nobody",
        activity_visibility="close_friends",
    ).save()


#: what the target does that a blocked viewer, or a stranger to a target sharing with its
#: contacts only, may not see
CHANGES: dict[str, Callable[[Any, Any], Awaitable[None]]] = {
    "comes online": _online,
    "sets a status": _status,
    "goes invisible": _invisible,
    "follows someone else": _follows_someone_else,
    "blocks someone else": _blocks_someone_else,
    "shares with close friends only": _shares_with_close_friends_only,
    "saves settings built by hand": _saves_settings_built_by_hand,
}


async def _nothing(target: Any, other: Any) -> None:
    return None


async def _unfollows(target: Any, other: Any) -> None:
    await sync_to_async(Contact.objects.filter(owner=target, contact=other).delete)()


async def _never_shares_activity_with(target: Any, other: Any) -> None:
    await sync_to_async(PrivacyException.objects.create)(
        owner=target, viewer=other, setting="activity_visibility", allow=False
    )


#: what the target does about the blocked viewer itself, which a block still hides: only the
#: block made or lifted changes what either sees of the other
ACROSS_THE_BLOCK: dict[str, Callable[[Any, Any], Awaitable[None]]] = {
    "unfollows the viewer": _unfollows,
    "never shares activity with the viewer": _never_shares_activity_with,
}


async def cast(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    viewer_is: str,
    friend_online: bool = True,
) -> tuple[Any, Any, Any, Any]:
    """The viewer, the target it may not see (it blocked the viewer, or shares with its contacts
    only and the viewer is none), a friend the viewer may see (a contact of the viewer, online
    unless not ``friend_online``: never seen), and a bystander; set up a minute before the
    clock's start, which it is back at."""
    viewer = await new_user(make_user)
    target = await new_user(make_user)
    friend = await new_user(make_user)
    bystander = await new_user(make_user)
    clock.shift(-60)
    # The target's shard keeps change stamps from here on (on a Redis Cluster, a shard that
    # never kept any proves nothing: the full snapshot): a custom status only contacts see.
    await sync_to_async(api.set_status)(target, "auto", text="setting up")
    await lets_see(friend, viewer)
    if friend_online:
        await api.atouch(friend)
    if viewer_is == "blocked":
        await lets_see(target, viewer)  # it would see the target but for the block
        await sync_to_async(Block.objects.create)(blocker=target, blocked=viewer)
    clock.shift(60)
    return viewer, target, friend, bystander


@pytest.mark.parametrize("viewer_is", ["blocked", "stranger"])
@pytest.mark.parametrize("change", [None, *CHANGES])
async def test_a_stamped_subscribe_answers_the_same_whether_the_target_changed_or_not(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    viewer_is: str,
    change: str | None,
) -> None:
    viewer, target, friend, bystander = await cast(make_user, clock, viewer_is)
    stamp, _ = await render_page(viewer, target, friend)
    clock.shift(1)
    await CHANGES.get(change or "", _nothing)(target, bystander)
    clock.shift(4)
    communicator = await sockets.open(viewer)

    frame = await subscribe_since(communicator, stamp, target, friend)

    assert frame["presences"] == {}
    assert frame["unchanged"] == ids(target, friend)


@pytest.mark.parametrize("viewer_is", ["blocked", "stranger"])
@pytest.mark.parametrize("change", list(CHANGES))
async def test_no_diff_tells_a_page_s_socket_of_a_change_it_may_not_see(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    viewer_is: str,
    change: str,
) -> None:
    # The friend is offline at the page: its coming online is the witness below.
    viewer, target, friend, bystander = await cast(make_user, clock, viewer_is, False)
    stamp, _ = await render_page(viewer, target, friend)
    clock.shift(1)
    communicator = await sockets.open(viewer)
    assert (await subscribe_since(communicator, stamp, target, friend))["presences"] == {}

    await CHANGES[change](target, bystander)
    # A change the viewer may see, made after: a diff of the target, had one been sent, would
    # come before this one or with it.
    await api.atouch(friend)

    frame = await communicator.receive_json_from(timeout=TIMEOUT)
    assert frame["type"] == "presence_diff"
    assert list(frame["presences"]) == [str(wire_id(friend))]


@pytest.mark.parametrize("path", ["resume", "live"])
@pytest.mark.parametrize("change", list(ACROSS_THE_BLOCK))
async def test_a_change_about_a_blocked_viewer_itself_is_not_told_to_it(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    change: str,
    path: str,
) -> None:
    viewer, target, friend, _ = await cast(make_user, clock, "blocked", False)
    stamp, _ = await render_page(viewer, target, friend)
    clock.shift(1)
    if path == "resume":
        await ACROSS_THE_BLOCK[change](target, viewer)
        clock.shift(4)
        resumed = await sockets.open(viewer)
        frame = await subscribe_since(resumed, stamp, target, friend)
        assert frame["presences"] == {} and frame["unchanged"] == ids(target, friend)
        return
    # A page's socket subscribed before the change.
    live = await sockets.open(viewer)
    assert (await subscribe_since(live, stamp, target, friend))["presences"] == {}
    await ACROSS_THE_BLOCK[change](target, viewer)
    await api.atouch(friend)  # the witness: a diff of the target would come first or with it
    frame = await live.receive_json_from(timeout=TIMEOUT)
    assert frame["type"] == "presence_diff"
    assert list(frame["presences"]) == [str(wire_id(friend))]


async def test_an_invisible_user_changing_its_online_level_tells_no_one(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """Invisible hides the online status whatever the level: a stranger the new level admits
    sees nothing new (and so learns nothing of the invisible user being active)."""
    viewer, target, friend, _ = await cast(make_user, clock, "stranger", False)
    clock.shift(-60)
    await _invisible(target, None)
    await api.atouch(target)  # online, invisible
    clock.shift(60)
    stamp, _ = await render_page(viewer, target, friend)
    clock.shift(1)

    @sync_to_async
    def shares_with_everyone() -> None:
        settings = PrivacySettings.objects.get(user=target)
        settings.online_visibility = "everyone"
        settings.save()

    await shares_with_everyone()
    clock.shift(4)
    communicator = await sockets.open(viewer)
    frame = await subscribe_since(communicator, stamp, target, friend)
    assert frame["presences"] == {} and frame["unchanged"] == ids(target, friend)


@pytest.mark.parametrize("level", ["contacts", "close_friends"])
async def test_a_contact_marked_a_close_friend_is_told_only_where_it_shows_them_more(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates, level: str
) -> None:
    """Where the user's levels show close friends what they show contacts, being marked one
    changes nothing the contact sees: its resume lists the user unchanged (it cannot tell it
    happened). Where the activity is for close friends only, it is told (it sees more)."""
    viewer, target, friend, _ = await cast(make_user, clock, "stranger", False)
    clock.shift(-60)
    await lets_see(target, viewer)
    await sync_to_async(PrivacySettings.objects.update_or_create)(
        user=target, defaults={"activity_visibility": level}
    )
    clock.shift(60)
    stamp, _ = await render_page(viewer, target, friend)
    clock.shift(1)
    await sync_to_async(api.set_close_friend)(target, viewer)
    clock.shift(4)
    communicator = await sockets.open(viewer)
    frame = await subscribe_since(communicator, stamp, target, friend)
    if level == "contacts":
        assert frame["presences"] == {} and frame["unchanged"] == ids(target, friend)
    else:
        assert frame["presences"][str(wire_id(target))]["text"] == "setting up"


async def test_a_page_s_socket_is_told_when_the_target_blocks_it(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, _, _ = await cast(make_user, clock, "stranger")
    clock.shift(-60)
    await lets_see(target, viewer)
    await api.atouch(target)
    clock.shift(60)
    communicator = await page_s_socket(sockets, clock, viewer, target, shows="online")

    await sync_to_async(Block.objects.create)(blocker=target, blocked=viewer)

    assert await diffed_status(communicator, target) == "offline"


async def test_a_viewer_who_may_see_the_change_is_still_told(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    _, target, _, _ = await cast(make_user, clock, "stranger")
    contact = await new_user(make_user)
    clock.shift(-60)
    await lets_see(target, contact)
    clock.shift(60)
    stamp, _ = await render_page(contact, target)
    clock.shift(1)
    await _status(target, None)
    clock.shift(4)
    page = await sockets.open(contact)
    answer = await subscribe_since(page, stamp, target)
    assert answer["presences"][str(wire_id(target))]["text"] == "in a meeting"
    assert answer["unchanged"] == []

    await _online(target, None)

    assert await diffed_status(page, target) == "dnd"


async def page_s_socket(
    sockets: Sockets,
    clock: time_machine.Coordinates,
    viewer: Any,
    target: Any,
    shows: str,
) -> WebsocketCommunicator:
    """The viewer's page of the target (which shows it ``shows``) and its socket, subscribed
    with the page's stamp a second later: nothing changed since."""
    stamp, shown = await render_page(viewer, target)
    assert shown[str(wire_id(target))]["status"] == shows
    clock.shift(1)
    communicator = await sockets.open(viewer)
    assert (await subscribe_since(communicator, stamp, target))["presences"] == {}
    return communicator


async def diffed_status(communicator: WebsocketCommunicator, target: Any) -> str:
    """The status of ``target`` in the socket's next frame, a diff."""
    frame = await communicator.receive_json_from(timeout=TIMEOUT)
    assert frame["type"] == "presence_diff"
    return str(frame["presences"][str(wire_id(target))]["status"])


async def test_a_page_s_socket_is_told_a_change_of_its_own_relation(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # The target adds the stranger: the stranger may see it from now on, so it is told.
    viewer, target, _, _ = await cast(make_user, clock, "stranger")
    clock.shift(-60)
    await api.atouch(target)
    clock.shift(60)
    communicator = await page_s_socket(sockets, clock, viewer, target, shows="offline")

    await lets_see(target, viewer)

    assert await diffed_status(communicator, target) == "online"


async def test_a_page_s_socket_is_told_when_the_levels_hide_the_user_from_it(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, _, _ = await cast(make_user, clock, "stranger")
    clock.shift(-60)
    await lets_see(target, viewer)  # a contact: it sees the target online, until the change
    await api.atouch(target)
    clock.shift(60)
    communicator = await page_s_socket(sockets, clock, viewer, target, shows="online")

    await _shares_with_close_friends_only(target, None)

    assert await diffed_status(communicator, target) == "offline"


# --- what ended before the viewer's view ----------------------------------------------------------


async def shows_strangers_what_ended(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, ago: float
) -> tuple[Any, Any, Any]:
    """A stranger, a target who shows strangers its online status and custom status but not
    its last seen, online ``ago`` seconds before the clock's start with a custom status of two
    minutes, and a contact of the stranger (offline: a witness). The clock is back at its
    start."""
    viewer, target, friend = [await new_user(make_user) for _ in range(3)]
    clock.shift(-ago)
    await sync_to_async(PrivacySettings.objects.create)(
        user=target,
        online_visibility="everyone",
        last_seen_visibility="nobody",
        activity_visibility="everyone",
    )
    await api.atouch(target)
    await sync_to_async(api.set_status)(
        target, "auto", text="at lunch", expires_at=timezone.now() + timedelta(minutes=2)
    )
    await lets_see(friend, viewer)
    clock.shift(ago)
    return viewer, target, friend


@sync_to_async
def _goes_invisible_in_the_admin(target: Any) -> None:
    settings = PrivacySettings.objects.get(user=target)
    settings.invisible = True
    settings.save()


@sync_to_async
def _shares_activity_with_contacts_only(target: Any) -> None:
    settings = PrivacySettings.objects.get(user=target)
    settings.activity_visibility = "contacts"
    settings.save()


#: what hides from the stranger only what ended (a turn offline, a custom status's end) before
#: its page: it sees the same before and after
HIDING_WHAT_ENDED: dict[str, Callable[[Any], Awaitable[None]]] = {
    "goes invisible": _goes_invisible_in_the_admin,
    "shares activity with contacts only": _shares_activity_with_contacts_only,
}


@pytest.mark.parametrize("path", ["resume", "live"])
@pytest.mark.parametrize("change", list(HIDING_WHAT_ENDED))
async def test_a_change_hiding_only_what_ended_is_not_told(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    change: str,
    path: str,
) -> None:
    """An offline user going invisible, whose last seen the stranger may not see anyway; the
    level of a custom status that ended (its row stays until presence_cleanup) narrowed: the
    stranger is shown the same before and after, so it is not told. Three hours ago: longer
    than a page's socket waits for the sweep to announce an end (twice SWEEP_INTERVAL here)."""
    viewer, target, friend = await shows_strangers_what_ended(make_user, clock, 3 * 3600)
    stamp, shown = await render_page(viewer, target, friend)
    seen = shown[str(wire_id(target))]
    assert (seen["status"], seen["last_seen"], seen["text"]) == ("offline", None, None)
    clock.shift(1)
    if path == "resume":
        await HIDING_WHAT_ENDED[change](target)
        clock.shift(4)
        resumed = await sockets.open(viewer)
        frame = await subscribe_since(resumed, stamp, target, friend)
        assert frame["presences"] == {} and frame["unchanged"] == ids(target, friend)
    else:
        live = await sockets.open(viewer)
        assert (await subscribe_since(live, stamp, target, friend))["presences"] == {}
        await HIDING_WHAT_ENDED[change](target)
        await api.atouch(friend)  # the witness: a diff of the target would come first or with it
        frame = await live.receive_json_from(timeout=TIMEOUT)
        assert frame["type"] == "presence_diff"
        assert list(frame["presences"]) == [str(wire_id(friend))]
    assert (await resolved(viewer, target))[str(wire_id(target))] == seen


@pytest.mark.parametrize("change", list(HIDING_WHAT_ENDED))
async def test_a_page_s_socket_is_told_a_change_hiding_what_ended_unannounced(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates, change: str
) -> None:
    """The page showed the user online with a custom status; both ended since, and the sweep
    has not announced it yet (when it does, the user is invisible, or the status no longer the
    stranger's: that announcement is not told to it). The change is what tells the page."""
    viewer, target, _ = await shows_strangers_what_ended(make_user, clock, 60)
    stamp, shown = await render_page(viewer, target)
    seen = shown[str(wire_id(target))]
    assert (seen["status"], seen["text"]) == ("online", "at lunch")
    clock.shift(1)
    live = await sockets.open(viewer)
    assert (await subscribe_since(live, stamp, target))["presences"] == {}
    clock.shift(300)  # offline (ONLINE_WINDOW) and the status over; no sweep ran

    await HIDING_WHAT_ENDED[change](target)

    frame = await live.receive_json_from(timeout=TIMEOUT)
    assert frame["type"] == "presence_diff"
    diffed = frame["presences"][str(wire_id(target))]
    assert (diffed["status"], diffed["text"]) == ("offline", None)


async def test_an_offline_user_going_invisible_is_told_who_saw_its_last_seen(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, _ = await shows_strangers_what_ended(make_user, clock, 3 * 3600)
    await sync_to_async(PrivacySettings.objects.filter(user=target).update)(
        last_seen_visibility="everyone"
    )
    stamp, shown = await render_page(viewer, target)
    assert shown[str(wire_id(target))]["last_seen"] is not None
    clock.shift(1)
    await _goes_invisible_in_the_admin(target)
    clock.shift(4)
    resumed = await sockets.open(viewer)
    frame = await subscribe_since(resumed, stamp, target)
    assert frame["presences"][str(wire_id(target))]["last_seen"] is None


@pytest.mark.parametrize("path", ["resume", "live"])
async def test_one_save_hiding_the_online_status_two_ways_is_told(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates, path: str
) -> None:
    """One save narrows the online level and turns invisible: the stranger who saw the user
    online sees them offline, and is told (judged with the settings after it, either alone
    would hide nothing more: the other hides it already)."""
    viewer, target, _ = await shows_strangers_what_ended(make_user, clock, 60)

    @sync_to_async
    def hides_it_two_ways() -> None:
        settings = PrivacySettings.objects.get(user=target)
        settings.online_visibility = "contacts"
        settings.invisible = True
        settings.save()

    if path == "live":
        communicator = await page_s_socket(sockets, clock, viewer, target, shows="online")
        await hides_it_two_ways()
        assert await diffed_status(communicator, target) == "offline"
        return
    stamp, shown = await render_page(viewer, target)
    assert shown[str(wire_id(target))]["status"] == "online"
    clock.shift(1)
    await hides_it_two_ways()
    clock.shift(4)
    resumed = await sockets.open(viewer)
    frame = await subscribe_since(resumed, stamp, target)
    assert frame["presences"][str(wire_id(target))]["status"] == "offline"
