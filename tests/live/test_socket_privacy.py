"""The WebSocket consumer at ws/presence/: privacy (the snapshot for every case of the matrix,
diffs, and changes taking effect on open connections at once).

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import transaction

from presence import api
from presence.models import Block, Contact, PrivacySettings, UserStatus
from tests.ids import wire_id
from tests.live.sockets import (
    HIDDEN,
    TIMEOUT,
    UNKNOWN_ID,
    Sockets,
    assert_silent,
    diff,
    error,
    heartbeat,
    iso,
    lets_see,
    new_user,
    online,
    presence,
    receive,
    set_own_status,
    state,
    status_reply,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.privacy_cases import CASES, LEVELS, NOW, Case, build, expected

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


# --- privacy: the snapshot, for every case of the matrix --------------------------------------


def expected_over_websocket(case: Case) -> dict[str, Any]:
    if case.relation != "self":
        return expected(case).as_json()
    # One's own connection makes one online on the web, whatever else the case says (an
    # online target's page requests, web and mobile, keep their devices).
    want = expected(replace(case, target_online=True))
    return replace(want, devices=("web", "mobile") if case.target_online else ("web",)).as_json()


def _variant_id(visibility: dict[str, str] | None) -> str:
    return Case(visibility, "self", False, True).id.split("-self-")[0]


@pytest.mark.privacy_matrix
async def test_privacy_matrix_through_the_snapshot(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """Every case of tests/privacy_cases.py, each viewer on a socket of its own."""
    assert len(CASES) == 308
    with time_machine.travel(NOW, tick=False):
        scenarios = await build_all(CASES, make_user)
        seen = []
        for start in range(0, len(scenarios), 28):  # a few dozen sockets at a time
            chunk = scenarios[start : start + 28]
            seen += await asyncio.gather(*(_snapshot_of(sockets, s) for s in chunk))
            await sockets.close_all()
    wrong = {
        scenario.case.id: got
        for scenario, got in zip(scenarios, seen, strict=True)
        if got != _expected_frames(scenario.case, scenario.target)
    }
    assert wrong == {}


@sync_to_async
def build_all(cases: list[Case], make_user: Callable[..., Any]) -> list[Any]:
    # One transaction: one commit instead of one per row (on_commit announcements included).
    with transaction.atomic():
        return [build(case, make_user) for case in cases]


def _expected_frames(case: Case, target: Any) -> list[dict[str, Any]]:
    if case.relation == "anonymous":
        # Anonymous viewers get no socket at all (whatever the target allows).
        return [{"type": "websocket.close", "code": 4401}]
    return [
        state({target.pk: expected_over_websocket(case)}),
        error(
            "unknown_users",
            f"No user has the id(s) {UNKNOWN_ID}; the others are subscribed.",
            users=[UNKNOWN_ID],
            answers="subscribe",
        ),
    ]


async def _snapshot_of(sockets: Sockets, scenario: Any) -> list[dict[str, Any]]:
    """What the scenario's viewer receives subscribing to the target (and an unknown id)."""
    target = scenario.target
    if scenario.viewer is None:
        communicator = sockets.make(AnonymousUser())
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        return [await communicator.receive_output(timeout=TIMEOUT)]
    communicator = await sockets.open(scenario.viewer)
    await communicator.send_json_to({"type": "subscribe", "users": [wire_id(target), UNKNOWN_ID]})
    return [await receive(communicator), await receive(communicator)]


# --- privacy: diffs ---------------------------------------------------------------------------

EVERYONE = dict.fromkeys(
    ("online_visibility", "last_seen_visibility", "activity_visibility"), "everyone"
)
DIFF_RELATIONS = ("contact", "close_friend", "stranger", "blocked_by_target", "blocking_target")
DIFF_VARIANTS = [
    (None, False),
    (EVERYONE, False),
    *[
        (EVERYONE | {field: level}, False)
        for field in ("online_visibility", "last_seen_visibility")
        for level in LEVELS[1:]
    ],
    (EVERYONE, True),
]


async def _watch(sockets: Sockets, scenario: Any) -> WebsocketCommunicator:
    communicator = await sockets.open(scenario.viewer)
    assert await subscribe(communicator, scenario.target) == state(
        {scenario.target.pk: expected(scenario.case).as_json()}
    ), scenario.case.id
    return communicator


async def test_privacy_of_diffs_when_targets_come_online(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """In each variant a viewer of each relation subscribes to an offline target of its own,
    which then comes online: a viewer who may see a change receives exactly it, the others
    nothing at all."""
    cases = [
        Case(v, relation, inv, False) for v, inv in DIFF_VARIANTS for relation in DIFF_RELATIONS
    ]
    with time_machine.travel(NOW, tick=False):
        scenarios = await build_all(cases, make_user)
        watchers = await asyncio.gather(*(_watch(sockets, s) for s in scenarios))
        for scenario in scenarios:
            await api.atouch(scenario.target, "web")  # online, last seen now

        told: dict[tuple[str, bool], tuple[list[str], list[str]]] = {}
        wrong = {}
        for scenario, communicator in zip(scenarios, watchers, strict=True):
            case = scenario.case
            before = expected(case)
            after = expected(replace(case, target_online=True))
            if after.online:
                after = replace(after, devices=("web",))
            yes, no = told.setdefault((_variant_id(case.visibility), case.invisible), ([], []))
            if after != before:
                got = await receive(communicator)
                if got != diff({scenario.target.pk: after.as_json()}):
                    wrong[case.id] = got
                yes.append(case.relation)
            else:
                no.append(case.relation)
        await assert_silent(*watchers)
    assert wrong == {}
    # Who learns something, per variant, spelled out from the contract's rules.
    assert told == EXPECTED_TOLD


SEES_ALL = ["contact", "close_friend", "stranger"]
BLOCKS = ["blocked_by_target", "blocking_target"]
#: (variant, invisible) -> (relations told that the target came online, relations told nothing)
EXPECTED_TOLD = {
    ("defaults", False): (["contact", "close_friend"], ["stranger", *BLOCKS]),
    ("all=everyone", False): (SEES_ALL, BLOCKS),
    ("online=contacts", False): (["contact", "close_friend"], ["stranger", *BLOCKS]),
    ("online=close_friends", False): (["close_friend"], ["contact", "stranger", *BLOCKS]),
    ("online=nobody", False): ([], [*SEES_ALL, *BLOCKS]),
    # Whoever sees the status sees the change, whether or not last seen is shown.
    ("last_seen=contacts", False): (SEES_ALL, BLOCKS),
    ("last_seen=close_friends", False): (SEES_ALL, BLOCKS),
    ("last_seen=nobody", False): (SEES_ALL, BLOCKS),
    ("all=everyone", True): ([], [*SEES_ALL, *BLOCKS]),
}

# --- privacy: changes take effect on open connections at once ---------------------------------


@pytest.fixture
async def watched(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> dict[str, Any]:
    """A target online with a custom status, watched by a contact and by itself."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    await sync_to_async(UserStatus.objects.create)(user=target, text="Hi", emoji="👋")
    tab = await sockets.open(target)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: online(text="Hi", emoji="👋")})
    assert await subscribe(tab, target) == state(
        {target.pk: online(text="Hi", emoji="👋", invisible=False)}
    )
    return {"viewer": viewer, "target": target, "watcher": watcher, "tab": tab}


async def test_blocking_hides_at_once_and_unblocking_reveals(watched: dict[str, Any]) -> None:
    viewer, target, watcher, tab = (
        watched["viewer"],
        watched["target"],
        watched["watcher"],
        watched["tab"],
    )
    shown = diff({target.pk: online(text="Hi", emoji="👋")})
    for blocker, blocked in ((target, viewer), (viewer, target)):
        block = await sync_to_async(Block.objects.create)(blocker=blocker, blocked=blocked)
        assert await receive(watcher) == diff({target.pk: HIDDEN})
        await sync_to_async(block.delete)()
        assert await receive(watcher) == shown
    await assert_silent(tab)  # one's own view never depends on blocks


async def test_removing_the_viewer_from_contacts_hides_at_once(watched: dict[str, Any]) -> None:
    viewer, target, watcher = watched["viewer"], watched["target"], watched["watcher"]
    await sync_to_async(Contact.objects.filter(owner=target, contact=viewer).delete)()
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    await lets_see(target, viewer)
    assert await receive(watcher) == diff({target.pk: online(text="Hi", emoji="👋")})
    # The viewer unfollowing the target changes nothing: the target's contacts decide.
    await sync_to_async(Contact.objects.create)(owner=viewer, contact=target)
    await sync_to_async(Contact.objects.filter(owner=viewer, contact=target).delete)()
    await assert_silent(watcher, watched["tab"])


async def test_the_contacts_api_reaches_open_sockets(watched: dict[str, Any]) -> None:
    """api.unfollow/follow/set_close_friend/block/unblock save rows as the admin does: open
    connections see each change at once (a site's own graph kept in sync through them)."""
    viewer, target, watcher = watched["viewer"], watched["target"], watched["watcher"]
    shown = diff({target.pk: online(text="Hi", emoji="👋")})
    assert await api.aunfollow(target, viewer) is True
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    assert await api.afollow(target, viewer) is True
    assert await receive(watcher) == shown
    assert await api.ablock(viewer, target) is True
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    assert await api.aunblock(viewer, target) is True
    assert await receive(watcher) == shown
    # Online to close friends only: the viewer sees it once marked, not after being unmarked
    # (the custom status stays visible to contacts).
    await sync_to_async(PrivacySettings.objects.create)(
        user=target, online_visibility="close_friends"
    )
    status_only = diff({target.pk: presence(text="Hi", emoji="👋")})
    assert await receive(watcher) == status_only
    assert await api.aset_close_friend(target, viewer) is True
    assert await receive(watcher) == shown
    assert await api.aset_close_friend(target, viewer, False) is True
    assert await receive(watcher) == status_only
    # Nothing to change: no signal, no diff.
    assert await api.aset_close_friend(target, viewer, False) is False
    assert await api.afollow(target, viewer) is False
    await assert_silent(watcher)


async def test_a_status_row_saved_by_the_site_or_the_admin_reaches_open_sockets(
    watched: dict[str, Any],
) -> None:
    """A moderator clearing an abusive text in the admin (a row saved, not set_status): the
    watchers see it at once, told only what they may see of it; set_status is told once."""
    target, watcher, tab = watched["target"], watched["watcher"], watched["tab"]
    row = await sync_to_async(UserStatus.objects.get)(user=target)
    row.text = ""
    await sync_to_async(row.save)()
    assert await receive(watcher) == diff({target.pk: online(emoji="👋")})
    assert await receive(tab) == diff({target.pk: online(emoji="👋", invisible=False)})
    row.dnd = True
    await sync_to_async(row.save)()
    dnd = presence("dnd", iso(0), ["web"], emoji="👋")
    assert await receive(watcher) == diff({target.pk: dnd})
    assert await receive(tab) == diff({target.pk: {**dnd, "invisible": False}})
    # A viewer who may not see the custom status is not told it changed.
    await sync_to_async(PrivacySettings.objects.create)(user=target, activity_visibility="nobody")
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(0), ["web"])})
    row.emoji = "🔥"
    await sync_to_async(row.save)()
    assert await receive(tab) == diff({target.pk: {**dnd, "emoji": "🔥", "invisible": False}})
    await assert_silent(watcher)
    # Deleting the row clears do not disturb; set_status is announced once, not per receiver.
    await sync_to_async(row.delete)()
    assert await receive(watcher) == diff({target.pk: online()})
    assert await receive(tab) == diff({target.pk: online(invisible=False)})
    await api.aset_status(target, "dnd")
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(0), ["web"])})
    assert await receive(tab) == diff(
        {target.pk: presence("dnd", iso(0), ["web"], invisible=False)}
    )
    await assert_silent(watcher, tab)


async def test_privacy_settings_take_effect_at_once(watched: dict[str, Any]) -> None:
    target, watcher = watched["target"], watched["watcher"]
    privacy = await sync_to_async(PrivacySettings.objects.create)(
        user=target, online_visibility="nobody"
    )
    # Offline with last seen hidden; the custom status follows its own setting (contacts).
    hidden = presence(text="Hi", emoji="👋")
    assert await receive(watcher) == diff({target.pk: hidden})
    privacy.activity_visibility = "nobody"
    await sync_to_async(privacy.save)()
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    privacy.online_visibility = privacy.activity_visibility = "contacts"
    await sync_to_async(privacy.save)()
    assert await receive(watcher) == diff({target.pk: online(text="Hi", emoji="👋")})
    await assert_silent(watcher, watched["tab"])


async def test_going_invisible_looks_offline_to_others_only(watched: dict[str, Any]) -> None:
    target, watcher, tab = watched["target"], watched["watcher"], watched["tab"]
    own = online(invisible=True)
    assert await set_own_status(tab, status="invisible") == (
        status_reply(own),
        diff({target.pk: own}),
    )
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    # Heartbeats of an invisible user tell nobody anything.
    await heartbeat(tab, "idle")
    assert await receive(tab) == diff({target.pk: {**own, "status": "idle"}})
    await assert_silent(watcher)
    idle = presence("idle", iso(0), ["web"], invisible=False)
    assert await set_own_status(tab, status="auto") == (status_reply(idle), diff({target.pk: idle}))
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(0), ["web"])})
