"""presence.api read paths: the privacy matrix, round-trip bounds, status changes, outages."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from presence import api
from presence.domain import Device, InvalidInput, Presence, Status
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus
from presence.signals import presence_changed
from presence.store import READ_RECENT, get_store
from tests.conftest import RedisCommandCounter
from tests.live.sockets import sockets as sockets
from tests.privacy_cases import (
    CASE_IDS,
    CASES,
    CUSTOM,
    NOW,
    Case,
    Expected,
    build,
    count_round_trips,
    expected,
    expected_in_online_friends,
)

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]

UNKNOWN_ID = 987_654_321


def seen(presence: Presence) -> Expected:
    return Expected(
        status=presence.status.value,
        last_seen=presence.last_seen,
        devices=tuple(presence.devices),
        text=presence.text,
        emoji=presence.emoji,
        activity=presence.activity,
        invisible=presence.invisible,
        last_seen_approx=approx.value if (approx := presence.last_seen_approx) else None,
    )


async def _aget_presence(target: Any, viewer: Any) -> Presence:
    try:
        return await api.aget_presence(target, viewer)
    finally:
        # redis.asyncio clients belong to one event loop; async_to_sync's loop ends here.
        await get_store().aclose()


# --- the privacy matrix ---------------------------------------------------------------------


@pytest.mark.privacy_matrix
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_privacy_matrix(case: Case, make_user: Callable[..., Any]) -> None:
    with time_machine.travel(NOW, tick=False):
        scenario = build(case, make_user)
        target, viewer = scenario.target, scenario.viewer
        want = expected(case)

        assert seen(api.get_presence(target, viewer)) == want, "get_presence"
        # By id as well as by user, and alongside an id of no user (left out).
        bulk = api.bulk_presence([target.pk, UNKNOWN_ID], viewer)
        assert set(bulk) == {target.pk}
        assert seen(bulk[target.pk]) == want, "bulk_presence"
        assert seen(async_to_sync(_aget_presence)(target, viewer)) == want, "aget_presence"

        friends = api.online_friends(viewer)
        assert (target in friends) == expected_in_online_friends(case), "online_friends"


def test_anonymous_user_object_is_a_stranger(make_user: Callable[..., Any]) -> None:
    target = make_user()
    PrivacySettings.objects.create(user=target, online_visibility="everyone")
    api.touch(target)
    assert api.get_presence(target, AnonymousUser()).status is Status.ONLINE
    assert api.get_presence(target, None).status is Status.ONLINE
    PrivacySettings.objects.filter(user=target).update(online_visibility="contacts")
    assert api.get_presence(target, AnonymousUser()).status is Status.OFFLINE
    assert api.online_friends(AnonymousUser()) == []


def test_dnd_is_shown_to_permitted_viewers_only(make_user: Callable[..., Any]) -> None:
    target, contact, stranger = make_user(), make_user(), make_user()
    Contact.objects.create(owner=target, contact=contact)
    api.touch(target)
    own = api.set_status(target, "dnd")
    assert own.status is Status.DND
    assert own.invisible is False
    assert api.get_presence(target, contact).status is Status.DND
    assert api.get_presence(target, stranger).status is Status.OFFLINE


def test_dnd_of_an_offline_user_is_offline(make_user: Callable[..., Any]) -> None:
    target, contact = make_user(), make_user()
    Contact.objects.create(owner=target, contact=contact)
    api.set_status(target, "dnd")
    assert api.get_presence(target, contact).status is Status.OFFLINE
    assert api.get_presence(target, target).status is Status.OFFLINE


# --- round trips and queries ----------------------------------------------------------------


def _users(count: int) -> list[Any]:
    model = get_user_model()
    first = model.objects.count()
    names = [f"bulk{first + i}" for i in range(count)]
    model.objects.bulk_create([model(username=name, password="!") for name in names])
    return list(model.objects.filter(username__in=names).order_by("-pk"))


@pytest.mark.parametrize("count", [50, 500])
def test_bulk_presence_costs_one_query_and_one_round_trip(
    count: int, make_user: Callable[..., Any], redis_commands: RedisCommandCounter
) -> None:
    viewer = make_user()
    targets = _users(count)
    PrivacySettings.objects.bulk_create(
        [PrivacySettings(user=t, online_visibility="everyone") for t in targets]
    )
    online = targets[::2]
    for target in online:
        api.touch(target)
    get_store().client.ping()  # connect outside the measured part

    before = redis_commands.snapshot()
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        presences = api.bulk_presence(targets, viewer)
    executed = redis_commands.delta(before)

    assert len(queries) == 1
    assert trips.count == 1  # on a cluster: one round trip to each master, all at once
    # The one round trip reads every bucket: one ZMSCORE each, and one of its prior set (the
    # last seen before today's; server-side count as a check).
    buckets = {get_store().keys.bucket_of(t.pk) for t in targets}
    assert trips.commands[0] == ["ZMSCORE"] * 2 * len(buckets)
    assert executed == {"zmscore": 2 * len(buckets)}
    assert len(presences) == count
    online_ids = {t.pk for t in online}
    assert {pk for pk, p in presences.items() if p.status is Status.ONLINE} == online_ids


def test_async_bulk_presence_costs_one_query_and_one_round_trip(
    make_user: Callable[..., Any],
) -> None:
    viewer = make_user()
    targets = _users(100)
    for target in targets[:10]:
        api.touch(target)

    async def read() -> dict[int, Presence]:
        try:
            await get_store().async_client.ping()  # connect outside the measured part
            with count_round_trips() as trips:
                presences = await api.abulk_presence(targets, viewer)
            assert trips.count == 1
            return presences
        finally:
            await get_store().aclose()

    with CaptureQueriesContext(connection) as queries:
        presences = async_to_sync(read)()
    assert len(queries) == 1
    assert set(presences) == {t.pk for t in targets}


def test_bulk_presence_of_nobody_costs_nothing(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        assert api.bulk_presence([], viewer) == {}
    assert len(queries) == 0
    assert trips.count == 0


def test_unknown_ids_are_left_out(make_user: Callable[..., Any]) -> None:
    viewer, target = make_user(), make_user()
    presences = api.bulk_presence([UNKNOWN_ID, target.pk, UNKNOWN_ID + 1, target.pk], viewer)
    assert list(presences) == [target.pk]
    # get_presence of no user is simply hidden (offline, nothing else).
    assert api.get_presence(UNKNOWN_ID, viewer) == Presence()


def _friends_with(user: Any, friends: list[Any]) -> None:
    Contact.objects.bulk_create(
        [Contact(owner=user, contact=f) for f in friends]
        + [Contact(owner=f, contact=user) for f in friends]
    )


@pytest.mark.parametrize("count", [1, 300])
def test_online_friends_costs_two_queries_and_one_round_trip(
    count: int, make_user: Callable[..., Any]
) -> None:
    user = make_user()
    friends = _users(count)
    _friends_with(user, friends)
    for friend in friends:
        api.touch(friend)
    # Warm: the connection, and the read's script on every master (a first use loads it).
    get_store().client.script_load(READ_RECENT.source)

    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        found = api.online_friends(user)

    # friend ids, then the privacy facts and user rows of the online ones: the same whatever
    # the number of friends
    assert len(queries) == 2
    assert trips.count == 1
    assert {f.pk for f in found} == {f.pk for f in friends}


def test_online_friends_order_limit_and_who_counts(make_user: Callable[..., Any]) -> None:
    user = make_user()
    early, late, idle_offline, one_way, hidden = (make_user() for _ in range(5))
    _friends_with(user, [early, late, idle_offline, hidden])
    Contact.objects.create(owner=user, contact=one_way)  # not mutual: not a friend
    PrivacySettings.objects.create(user=hidden, online_visibility="nobody")
    with time_machine.travel(NOW - timedelta(hours=1), tick=False):
        api.touch(idle_offline)
    with time_machine.travel(NOW - timedelta(seconds=100), tick=False):
        api.touch(early)
        api.touch(one_way)
        api.touch(hidden)
    with time_machine.travel(NOW - timedelta(seconds=10), tick=False):
        api.touch(late)
    with time_machine.travel(NOW, tick=False):
        assert api.online_friends(user) == [late, early]
        assert api.online_friends(user, limit=1) == [late]
        assert api.online_friends(user, limit=0) == []
        with pytest.raises(ValueError):
            api.online_friends(user, limit=-1)


@override_settings(PRESENCE={"ONLINE_WINDOW": 30, "CONNECTION_TTL": 90, "OFFLINE_GRACE": 5})
def test_online_friends_reads_back_as_far_as_the_longest_way_of_being_online(
    make_user: Callable[..., Any],
) -> None:
    # Redis answers only for friends active since the longest of the window, the connection TTL
    # and the grace: a connection's friend heard from 60 s ago is online (TTL 90) though a page
    # view as old is not (window 30), and one signed off 3 s ago is still within the grace.
    user = make_user()
    connected, viewed, signed_off, gone = (make_user() for _ in range(4))
    _friends_with(user, [connected, viewed, signed_off, gone])
    store = get_store()
    at = NOW.timestamp()
    store.run(store.plans.connection(connected.pk, "open", at - 60, "c1"))
    store.run(store.plans.touch(viewed.pk, Device.WEB, at - 60))
    store.run(store.plans.sign_off(signed_off.pk, Device.WEB, at - 3))
    store.run(store.plans.connection(gone.pk, "open", at - 200, "c2"))
    with time_machine.travel(NOW, tick=False):
        assert api.online_friends(user) == [signed_off, connected]
        assert async_to_sync(api.aonline_friends)(user) == [signed_off, connected]


# --- choosing a status ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"status": "away"}, "invalid_value"),
        ({"status": "offline"}, "invalid_value"),
        ({"status": None}, "invalid_message"),
        ({"status": "dnd", "text": 42}, "invalid_message"),
        ({"status": "dnd", "text": "x" * 141}, "invalid_value"),
        ({"status": "dnd", "emoji": "🙂" * 17}, "invalid_value"),
        ({"status": "dnd", "activity": "x" * 141}, "invalid_value"),
        ({"status": "dnd", "text": "line\nbreak"}, "invalid_value"),
        (
            {"status": "dnd", "text": "hi", "expires_at": NOW - timedelta(minutes=1)},
            "invalid_value",
        ),
        ({"status": "dnd", "text": "hi", "expires_at": NOW}, "invalid_value"),
        ({"status": "dnd", "text": "hi", "expires_at": datetime(2025, 3, 15)}, "invalid_value"),
        (
            {"status": "dnd", "text": "hi", "expires_at": NOW + timedelta(days=31)},
            "invalid_value",
        ),
    ],
)
def test_set_status_rejects_bad_input_and_saves_nothing(
    kwargs: dict[str, Any], code: str, make_user: Callable[..., Any]
) -> None:
    user = make_user()
    with time_machine.travel(NOW, tick=False):
        api.set_status(user, "auto", text="Before")
        with pytest.raises(InvalidInput) as info:
            api.set_status(user, **kwargs)
    assert info.value.code == code
    assert isinstance(info.value, ValueError)
    status = UserStatus.objects.get(user=user)
    assert (status.dnd, status.text) == (False, "Before")
    assert PrivacySettings.objects.get(user=user).invisible is False


def test_set_status_round_trip(make_user: Callable[..., Any]) -> None:
    user, contact = make_user(), make_user()
    Contact.objects.create(owner=user, contact=contact)
    api.touch(user)

    own = api.set_status(user, "invisible", text="Heads down", emoji="🎧")
    assert (own.status, own.invisible, own.text, own.emoji) == (
        Status.ONLINE,
        True,
        "Heads down",
        "🎧",
    )
    as_contact = api.get_presence(user, contact)
    assert (as_contact.status, as_contact.last_seen, as_contact.devices) == (
        Status.OFFLINE,
        None,
        (),
    )
    assert as_contact.text == "Heads down"  # custom status follows activity_visibility

    own = api.set_status(user, "auto")
    assert (own.status, own.invisible, own.text, own.emoji) == (Status.ONLINE, False, None, None)
    assert api.get_presence(user, contact).status is Status.ONLINE
    assert UserStatus.objects.get(user=user).text == ""


def test_set_status_keeps_privacy_choices(make_user: Callable[..., Any]) -> None:
    user = make_user()
    PrivacySettings.objects.create(user=user, online_visibility="nobody")
    api.set_status(user, "invisible")
    api.set_status(user, "auto")
    assert PrivacySettings.objects.get(user=user).online_visibility == "nobody"


def test_custom_status_expires_but_dnd_remains(make_user: Callable[..., Any]) -> None:
    user, contact = make_user(), make_user()
    Contact.objects.create(owner=user, contact=contact)
    expires_at = NOW + timedelta(hours=1)
    with time_machine.travel(NOW, tick=False):
        api.set_status(user, "dnd", activity="In a meeting", expires_at=expires_at)
    for moment, shown in [
        (expires_at - timedelta(seconds=1), "In a meeting"),
        (expires_at, None),
        (expires_at + timedelta(days=1), None),
    ]:
        with time_machine.travel(moment, tick=False):
            api.touch(user)
            for viewer in (user, contact):
                presence = api.get_presence(user, viewer)
                assert presence.activity == shown, (moment, viewer)
                assert presence.status is Status.DND


def test_custom_status_without_expiry_stays(make_user: Callable[..., Any]) -> None:
    user = make_user()
    with time_machine.travel(NOW, tick=False):
        api.set_status(user, "auto", text="Hello")
    with time_machine.travel(NOW + timedelta(days=365), tick=False):
        assert api.get_presence(user, user).text == "Hello"


# --- last seen: Redis first, the database as fallback ---------------------------------------


def test_last_seen_comes_from_redis_then_falls_back_to_database(
    make_user: Callable[..., Any], redis_client: redis.Redis
) -> None:
    target, contact = make_user(), make_user()
    Contact.objects.create(owner=target, contact=contact)
    persisted = NOW - timedelta(days=3)
    LastSeen.objects.create(user=target, seen_at=persisted)
    with time_machine.travel(NOW - timedelta(hours=1), tick=False):
        api.touch(target)
    with time_machine.travel(NOW, tick=False):
        presence = api.get_presence(target, contact)
        assert (presence.status, presence.last_seen) == (Status.OFFLINE, NOW - timedelta(hours=1))
        redis_client.flushdb()
        presence = api.get_presence(target, contact)
        assert (presence.status, presence.last_seen) == (Status.OFFLINE, persisted)


def test_last_seen_never_moves_back_to_an_older_redis_entry(
    make_user: Callable[..., Any],
) -> None:
    target = make_user()
    with time_machine.travel(NOW - timedelta(days=2), tick=False):
        api.touch(target)
    LastSeen.objects.create(user=target, seen_at=NOW - timedelta(days=1))
    with time_machine.travel(NOW, tick=False):
        assert api.get_presence(target, target).last_seen == NOW - timedelta(days=1)


def test_no_activity_anywhere_means_no_last_seen(make_user: Callable[..., Any]) -> None:
    target = make_user()
    assert api.get_presence(target, target) == Presence(invisible=False)


# --- Redis outage ---------------------------------------------------------------------------

DOWN = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
    }
}


def test_reads_survive_a_redis_outage(
    make_user: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    target, friend = make_user(), make_user()
    _friends_with(target, [friend])
    persisted = NOW - timedelta(hours=5)
    LastSeen.objects.create(user=target, seen_at=persisted)
    api.touch(target)  # online in the real Redis; unreachable below
    caplog.set_level(logging.WARNING, logger="presence")
    with override_settings(CACHES=DOWN), time_machine.travel(NOW, tick=False):
        for viewer in (friend, target):
            presence = api.get_presence(target, viewer)
            assert (presence.status, presence.last_seen, presence.devices) == (
                Status.OFFLINE,
                persisted,
                (),
            )
        assert api.bulk_presence([target, friend], friend)[target.pk].last_seen == persisted
        assert async_to_sync(_aget_presence)(target, friend).last_seen == persisted
        assert api.online_friends(friend) == []
    # Only the unreachable Redis counts: switching CACHES closes the real store's clients, and
    # on the cluster a connection closed under a thread still using it may log a node as well.
    outage_logs = [r for r in caplog.records if "Redis is unavailable" in r.getMessage()]
    assert len(outage_logs) == 1  # once per outage, not once per read


# --- async twins, in a real event loop ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_async_twins(make_user: Callable[..., Any]) -> None:
    from asgiref.sync import sync_to_async

    @sync_to_async
    def setup() -> tuple[Any, Any, Any]:
        user, friend, stranger = make_user(), make_user(), make_user()
        _friends_with(user, [friend])
        PrivacySettings.objects.create(user=stranger, online_visibility="everyone")
        UserStatus.objects.create(user=friend, **CUSTOM)
        return user, friend, stranger

    user, friend, stranger = await setup()
    try:
        with time_machine.travel(NOW, tick=False):
            await api.atouch(friend, "desktop")
            await api.atouch(stranger)
            presence = await api.aget_presence(friend, user)
            assert (presence.status, presence.last_seen, presence.devices, presence.text) == (
                Status.ONLINE,
                NOW,
                ("desktop",),
                CUSTOM["text"],
            )
            both = await api.abulk_presence([friend, stranger, UNKNOWN_ID], user)
            assert set(both) == {friend.pk, stranger.pk}
            assert both[stranger.pk].status is Status.ONLINE
            assert both[stranger.pk].text is None
            assert await api.aonline_friends(user) == [friend]
            assert await api.aonline_friends(user, limit=0) == []
            own = await api.aset_status(user, "dnd")
            assert own.status is Status.OFFLINE  # dnd shows only while online
            await api.asign_off(friend, "desktop")
        with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
            assert await api.aonline_friends(user) == []
            presence = await api.aget_presence(friend, user)
            assert (presence.status, presence.last_seen) == (Status.OFFLINE, NOW)
    finally:
        await get_store().aclose()


def test_expected_table_is_not_trivial() -> None:
    # Guard against a matrix that would pass by showing everything or nothing.
    outcomes = {expected(case).as_json()["status"] for case in CASES}
    assert outcomes == {"online", "offline"}
    last_seen = {expected(case).last_seen is None for case in CASES}
    assert last_seen == {True, False}
    texts = {expected(case).text for case in CASES}
    assert texts == {None, CUSTOM["text"]}
    assert len(CASES) == 11 * 7 * 2 * 2
    assert NOW.tzinfo is UTC


# --- notify_changed: writes the model signals do not see -------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_notify_changed_after_a_bulk_update_reaches_open_sockets(
    sockets: Any, settings: Any, make_user: Callable[..., Any]
) -> None:
    from tests.live.sockets import BASE, assert_silent, receive, subscribe

    settings.PRESENCE = dict(BASE)
    alice, carol = await sync_to_async(make_user)(), await sync_to_async(make_user)()

    @sync_to_async
    def arrange() -> None:
        Contact.objects.create(owner=alice, contact=carol, close_friend=True)
        PrivacySettings.objects.create(user=alice, activity_visibility="close_friends")
        api.set_status(alice, "auto", text="secret plans")

    await arrange()
    await sockets.open(alice)
    carol_tab = await sockets.open(carol)
    seen = (await subscribe(carol_tab, alice))["presences"][str(alice.pk)]
    assert seen["text"] == "secret plans"

    # update() sends no post_save: open sockets hear nothing of it by themselves...
    await sync_to_async(Contact.objects.filter(owner=alice).update)(close_friend=False)
    await assert_silent(carol_tab)
    # ...until the site says so.
    await api.anotify_changed([alice], reason="contacts")
    changed = await receive(carol_tab)
    assert changed["type"] == "presence_diff"
    assert changed["presences"][str(alice.pk)]["text"] is None

    # The sync call, after commit, with user ids.
    await sync_to_async(PrivacySettings.objects.filter(user=alice).update)(
        activity_visibility="everyone"
    )

    @sync_to_async
    def notify_in_a_transaction() -> None:
        with transaction.atomic():
            api.notify_changed([alice.pk])

    await notify_in_a_transaction()
    changed = await receive(carol_tab)
    assert changed["presences"][str(alice.pk)]["text"] == "secret plans"


# --- contacts and blocks -------------------------------------------------------------------


def _changes(reasons: list[tuple[int, str]]) -> Callable[..., None]:
    def record(sender: Any, user_id: int, reason: str, **kwargs: Any) -> None:
        reasons.append((user_id, reason))

    return record


def test_the_contacts_api_saves_rows_and_sends_presence_changed(
    make_user: Callable[..., Any], django_capture_on_commit_callbacks: Any
) -> None:

    ann, ben = make_user("ann"), make_user("ben")
    sent: list[tuple[int, str]] = []
    receiver = _changes(sent)
    presence_changed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert api.follow(ann, ben) is True
            assert api.follow(ann.pk, ben.pk) is False  # ids work; nothing new
        assert Contact.objects.filter(owner=ann, contact=ben, close_friend=False).exists()
        assert sent == [(ann.pk, "contacts")]

        sent.clear()
        with django_capture_on_commit_callbacks(execute=True):
            assert api.set_close_friend(ann, ben) is True
            assert api.set_close_friend(ann, ben) is False
        assert Contact.objects.get(owner=ann, contact=ben).close_friend is True
        assert sent == [(ann.pk, "contacts")]

        sent.clear()
        with django_capture_on_commit_callbacks(execute=True):
            assert api.unfollow(ann, ben) is True
            assert api.unfollow(ann, ben) is False
        assert not Contact.objects.exists()
        assert sent == [(ann.pk, "contacts")]

        sent.clear()
        with django_capture_on_commit_callbacks(execute=True):
            assert api.block(ben, ann) is True
            assert api.block(ben, ann) is False
            assert api.unblock(ben, ann) is True
            assert api.unblock(ben, ann) is False
        assert not Block.objects.exists()
        assert sorted(sent) == sorted([(ben.pk, "block"), (ann.pk, "block")] * 2)
    finally:
        presence_changed.disconnect(receiver)


def test_set_close_friend_follows_first_when_needed(make_user: Callable[..., Any]) -> None:

    ann, ben = make_user("ann"), make_user("ben")
    assert api.set_close_friend(ann, ben) is True
    assert Contact.objects.get(owner=ann, contact=ben).close_friend is True


def test_unmarking_a_close_friend_keeps_the_contact_and_follows_no_one(
    make_user: Callable[..., Any],
) -> None:
    ann, ben, cat = make_user("ann"), make_user("ben"), make_user("cat")
    api.set_close_friend(ann, ben)
    assert api.set_close_friend(ann, ben, False) is True
    assert Contact.objects.get(owner=ann, contact=ben).close_friend is False
    # A stranger stays a stranger: under the default level a contact would see ann online.
    api.touch(ann)
    assert api.set_close_friend(ann, cat, False) is False
    assert not Contact.objects.filter(owner=ann, contact=cat).exists()
    assert api.get_presence(ann, cat).status == "offline"


@pytest.mark.parametrize("call", ["follow", "set_close_friend", "block"])
def test_the_contacts_api_refuses_self_and_unknown_users(
    make_user: Callable[..., Any], call: str
) -> None:

    ann = make_user("ann")
    with pytest.raises(InvalidInput) as raised:
        getattr(api, call)(ann, ann)
    assert raised.value.code == "invalid_value"
    with pytest.raises(InvalidInput) as raised:
        getattr(api, call)(ann, 987_654_321)
    assert raised.value.code == "unknown_users"
    assert not Contact.objects.exists() and not Block.objects.exists()
