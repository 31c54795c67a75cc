"""Who a window resolves (presence.hub.rooms): a viewer whose list is full and lists none of
the changed users gets its count only (set lookups, no pair facts read for it); the viewers
listing a changed user, or with room in their list, are resolved. Either way every view ends
as a fresh read for that viewer says: the count (blocks either way, invisible members, hidden
members in ``others``) and the list."""

from __future__ import annotations

import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from presence import api, relations
from presence.domain.rooms import parse_room
from presence.hub import rooms as hub_rooms
from presence.hub.groups import Groups
from presence.hub.registry import Registry, View
from presence.hub.rooms import RoomViews
from presence.models import Block, Contact, PrivacySettings
from presence.rooms import writes as events
from presence.rooms.reading import aread_room_state
from presence.store import get_store, merge
from tests.rooms.rules import ROOMS
from tests.rooms.test_fanout import Viewer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.uuid_site, pytest.mark.cluster]

ROOM = "post:1"
LIMIT = 5


@sync_to_async
def population() -> tuple[list[Any], list[Any], list[Any]]:
    User = get_user_model()
    early = [User.objects.create_user(username=f"e{n}") for n in range(8)]
    late = [User.objects.create_user(username=f"l{n}") for n in range(6)]
    viewers = [User.objects.create_user(username=f"v{n}") for n in range(5)]
    for user in [*early[4:], *late[:4], *viewers]:
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
    # The first four are seen by their contacts only: every viewer but viewer 3, whose list
    # therefore has room (four listed, the four hidden in others).
    for user in early[:4]:
        PrivacySettings.objects.create(user=user, online_visibility="contacts")
        for viewer in viewers:
            if viewer is not viewers[3]:
                Contact.objects.create(owner=user, contact=viewer)
    # late[4] keeps the default visibility (hidden from the viewers: counted in others),
    # late[5] is invisible (counted by nobody).
    PrivacySettings.objects.create(user=late[5], invisible=True)
    Block.objects.create(blocker=late[0], blocked=viewers[1])  # a newcomer blocks viewer 1
    Block.objects.create(blocker=viewers[2], blocked=late[1])  # viewer 2 blocks a newcomer
    return early, late, viewers


async def enter(store: Any, users: list[Any], at: float, invisible: set[Any]) -> None:
    """The users join in this order (10 ms apart: the order by join time is theirs)."""
    await store.arun(merge([store.plans.connection(u.pk, "open", at, "c") for u in users]))
    await store.arun(
        merge(
            [
                store.plans.join_room(ROOM, u.pk, "c", at + n / 100, None, u.pk in invisible)
                for n, u in enumerate(users)
            ]
        )
    )


async def test_full_lists_get_their_count_without_resolution(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": LIMIT}
    early, late, viewers = await population()
    store = get_store()
    now = time.time()
    await enter(store, early, now - 10, set())
    registry = Registry()
    rooms = RoomViews(registry, Groups(None, registry))
    connections = [Viewer(user) for user in viewers]
    for connection in connections:
        registry.rooms.add(connection, ROOM)  # type: ignore[arg-type]
        rooms.views[connection] = {ROOM: View()}  # type: ignore[index]
        state = await aread_room_state(parse_room(ROOM), connection.user)
        rooms.show(connection, ROOM, state)  # type: ignore[arg-type]
    for connection in connections:
        listed = len(rooms.views[connection][ROOM].listed)  # type: ignore[index]
        assert listed == (4 if connection is connections[3] else LIMIT)

    asked: list[set[Any]] = []
    real_load, real_aload = relations.load_pairs, relations.aload_pairs

    def load(viewer_pks: Any, target_ids: Any) -> Any:
        asked.append(set(viewer_pks))
        return real_load(viewer_pks, target_ids)

    async def aload(viewer_pks: Any, target_ids: Any) -> Any:
        asked.append(set(viewer_pks))
        return await real_aload(viewer_pks, target_ids)

    monkeypatch.setattr(relations, "load_pairs", load)
    monkeypatch.setattr(relations, "aload_pairs", aload)
    await enter(store, late, now, {late[5].pk})
    await rooms.deliver(ROOM, {u.pk for u in late})
    # Only the viewer with room in its list had pair facts read.
    assert asked and set().union(*asked) == {viewers[3].pk}

    for connection in connections:
        (frame,) = connection.frames
        view = rooms.views[connection][ROOM]  # type: ignore[index]
        fresh = await api.aroom_presence(ROOM, connection.user)
        assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"]), (
            connection.user
        )
        assert {str(uid) for uid in view.listed} == set(fresh["members"]), connection.user
    by_viewer = {c.user: c.frames[0] for c in connections}
    plain = len(early) + 5  # late[5] is invisible; late[4] hidden but counted
    assert by_viewer[viewers[0]]["count"] == plain
    assert by_viewer[viewers[1]]["count"] == plain - 1  # blocked by late[0]
    assert by_viewer[viewers[2]]["count"] == plain - 1  # blocks late[1]
    assert by_viewer[viewers[0]]["joins"] == {}
    # The viewer with room lists the first newcomer it may see, by join time.
    assert set(by_viewer[viewers[3]]["joins"]) == {str(late[0].pk)}


async def test_a_listed_member_that_changes_is_resolved_and_refilled(
    settings: Any,
) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": LIMIT}
    early, _, viewers = await population()
    store = get_store()
    await enter(store, early, time.time() - 10, set())
    registry = Registry()
    rooms = RoomViews(registry, Groups(None, registry))
    connection = Viewer(viewers[0])
    registry.rooms.add(connection, ROOM)  # type: ignore[arg-type]
    rooms.views[connection] = {ROOM: View()}  # type: ignore[index]
    rooms.show(connection, ROOM, await aread_room_state(parse_room(ROOM), viewers[0]))  # type: ignore[arg-type]
    listed = list(rooms.views[connection][ROOM].listed)  # type: ignore[index]
    # A listed member blocks the viewer: left out of the list and the count, the next member
    # by join time takes its place in the same frame.
    await sync_to_async(Block.objects.create)(blocker_id=listed[0], blocked=viewers[0])
    await rooms.deliver(ROOM, {listed[0]})
    (frame,) = connection.frames
    assert frame["leaves"] == [str(listed[0])]
    assert set(frame["joins"]) == {str(early[LIMIT].pk)}
    fresh = await api.aroom_presence(ROOM, viewers[0])
    view = rooms.views[connection][ROOM]  # type: ignore[index]
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"])


async def one_viewer(
    settings: Any, members: int, public: int
) -> tuple[list[Any], Any, Viewer, RoomViews, View]:
    """``members`` members joined 10 ms apart, the first ``public`` of them (and the viewer)
    showing their status to everyone, the rest hidden; the viewer's view read: (the members,
    the viewer, its connection, the hub's rooms, its view)."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": LIMIT, "OFFLINE_GRACE": 2}
    User = get_user_model()

    @sync_to_async
    def users() -> tuple[list[Any], Any]:
        made = [User.objects.create_user(username=f"m{n}") for n in range(members)]
        viewer = User.objects.create_user(username="viewer")
        for user in [*made[:public], viewer]:
            PrivacySettings.objects.create(user=user, online_visibility="everyone")
        return made, viewer

    made, viewer_user = await users()
    await enter(get_store(), made, time.time() - 20, set())
    return made, viewer_user, *await watch(viewer_user)


async def watch(viewer_user: Any) -> tuple[Viewer, RoomViews, View]:
    """The viewer's connection in the room, with the hub's rooms and its view read: (its
    connection, the hub's rooms, its view)."""
    registry = Registry()
    rooms = RoomViews(registry, Groups(None, registry))
    viewer = Viewer(viewer_user)
    registry.rooms.add(viewer, ROOM)  # type: ignore[arg-type]
    rooms.views[viewer] = {ROOM: View()}  # type: ignore[index]
    rooms.show(viewer, ROOM, await aread_room_state(parse_room(ROOM), viewer_user))  # type: ignore[arg-type]
    return viewer, rooms, rooms.views[viewer][ROOM]  # type: ignore[index]


async def join_anew(user: Any) -> None:
    """``user`` leaves, and joins again once its stay ended (OFFLINE_GRACE 2 s)."""
    store, now = get_store(), time.time()
    await store.arun(store.plans.leave_room(ROOM, user.pk, "c", now - 15))
    await store.arun(store.plans.join_room(ROOM, user.pk, "c", now - 1))


async def test_a_listed_member_who_joins_anew_takes_its_new_place(settings: Any) -> None:
    # Its stay ended and it joined again within one window: listed by its first join time,
    # it now comes after the members who waited in ``others``, and a fresh read lists one of
    # them instead (the view kept it where it was, for good).
    members, viewer_user, viewer, rooms, view = await one_viewer(settings, LIMIT + 3, LIMIT + 3)
    assert set(view.listed) == {m.pk for m in members[:LIMIT]} and view.others == 3
    moved = members[1]
    await join_anew(moved)
    await rooms.deliver(ROOM, {moved.pk})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert str(moved.pk) not in fresh["members"]
    (frame,) = viewer.frames
    assert frame["leaves"] == [str(moved.pk)] and set(frame["joins"]) == {str(members[LIMIT].pk)}
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"])
    # A member who waits in others and did not change: no frame.
    viewer.frames.clear()
    await rooms.deliver(ROOM, {members[LIMIT + 2].pk})
    assert viewer.frames == []


@pytest.mark.parametrize(
    ("members", "public"),
    [
        # The list has room (the others are hidden from the viewer): every member the viewer
        # may see is listed.
        (2 * LIMIT + 3, 3),
        # The list is full, and every member it does not list is hidden from the viewer.
        (3 * LIMIT + 3, LIMIT),
    ],
    ids=["list_with_room", "full_list_whose_others_are_hidden"],
)
async def test_a_member_who_joins_anew_stays_listed_when_the_others_are_hidden(
    settings: Any, members: int, public: int
) -> None:
    # One listed member who joined anew is now last by join time, past the first members a
    # refill reads (SCAN_FACTOR * LIMIT), and still the viewer's to list (a fresh read lists
    # it): it stays, nobody leaves.
    users, viewer_user, viewer, rooms, view = await one_viewer(settings, members, public)
    assert set(view.listed) == {m.pk for m in users[:public]}
    assert view.others == members - public
    moved = users[1]
    await join_anew(moved)
    await rooms.deliver(ROOM, {moved.pk})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert str(moved.pk) in fresh["members"]
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert all(frame["leaves"] == [] for frame in viewer.frames)
    assert (fresh["count"], fresh["others"]) == (members, members - public)


async def test_two_listed_members_who_join_anew_in_one_window_both_leave_a_full_list(
    settings: Any,
) -> None:
    # A reconnect storm: several listed members' stays ended and they joined again, in one
    # window. The list was full with members waiting: each now comes after them, and a fresh
    # read lists the waiting ones (the first moved out must not make the list look as if it
    # had room for the second, kept at its new place past the end).
    members, viewer_user, viewer, rooms, view = await one_viewer(settings, LIMIT + 3, LIMIT + 3)
    assert set(view.listed) == {m.pk for m in members[:LIMIT]} and view.others == 3
    for moved in members[1:3]:
        await join_anew(moved)
    await rooms.deliver(ROOM, {m.pk for m in members[1:3]})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert {str(m.pk) for m in members[1:3]}.isdisjoint(fresh["members"])
    (frame,) = viewer.frames
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"])


async def test_every_listed_member_who_joins_anew_in_one_window_leaves_a_full_list(
    settings: Any,
) -> None:
    # The whole list's stays ended and they joined again, in one window, while members wait:
    # the last one looked at must leave as the others did (the list it would be measured
    # against is empty by then), and the members who waited are listed, as a fresh read does.
    members, viewer_user, viewer, rooms, view = await one_viewer(settings, LIMIT + 3, LIMIT + 3)
    listed = members[:LIMIT]
    assert set(view.listed) == {m.pk for m in listed} and view.others == 3
    for moved in listed:
        await join_anew(moved)
    await rooms.deliver(ROOM, {m.pk for m in listed})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    (frame,) = viewer.frames
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"])


async def test_a_place_left_in_a_full_list_goes_to_the_member_waiting_not_a_newcomer(
    settings: Any,
) -> None:
    # In one window a listed member's stay ended (swept) and a new member joined: the place
    # left is the first waiting member's (it joined before the newcomer), as a fresh read
    # lists it, not the newcomer's.
    members, viewer_user, viewer, rooms, view = await one_viewer(settings, LIMIT + 3, LIMIT + 3)

    @sync_to_async
    def newcomer() -> Any:
        user = get_user_model().objects.create_user(username="newcomer")
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
        return user

    new = await newcomer()
    gone = members[2]
    store, now = get_store(), time.time()
    await store.arun(store.plans.leave_room(ROOM, gone.pk, "c", now - 15))
    assert await events.asweep_rooms() == {ROOM: [gone.pk]}
    await store.arun(store.plans.connection(new.pk, "open", now, "c"))  # online
    await store.arun(store.plans.join_room(ROOM, new.pk, "c", now))
    await rooms.deliver(ROOM, {gone.pk, new.pk})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert str(new.pk) not in fresh["members"] and str(members[LIMIT].pk) in fresh["members"]
    (frame,) = viewer.frames
    assert frame["leaves"] == [str(gone.pk)] and set(frame["joins"]) == {str(members[LIMIT].pk)}
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"])


async def test_a_place_left_is_refilled_past_the_first_members_hidden_from_the_viewer(
    settings: Any,
) -> None:
    # The first members by join time are mostly hidden from the viewer (SCAN_FACTOR * LIMIT
    # of them hold only its listed ones): a place left in its full list goes to the first
    # member waiting further down, as a fresh read (which reads further) lists it. Left with
    # room, the list took the next newcomer instead, for good.
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": LIMIT, "OFFLINE_GRACE": 2}
    User = get_user_model()

    @sync_to_async
    def users() -> tuple[list[Any], Any, Any]:
        made = [User.objects.create_user(username=f"m{n}") for n in range(3 * LIMIT)]
        viewer, new = (User.objects.create_user(username=name) for name in ("viewer", "new"))
        # Public: the first LIMIT members and the last two (past SCAN_FACTOR * LIMIT); the
        # others keep the default visibility (hidden from the viewer, counted in others).
        for user in [*made[:LIMIT], *made[-2:], viewer, new]:
            PrivacySettings.objects.create(user=user, online_visibility="everyone")
        return made, viewer, new

    members, viewer_user, new = await users()
    store, now = get_store(), time.time()
    await enter(store, members, now - 20, set())
    viewer, rooms, view = await watch(viewer_user)
    assert set(view.listed) == {m.pk for m in members[:LIMIT]}

    gone = members[2]
    await store.arun(store.plans.leave_room(ROOM, gone.pk, "c", now - 15))
    assert await events.asweep_rooms() == {ROOM: [gone.pk]}
    await rooms.deliver(ROOM, {gone.pk})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert str(members[-2].pk) in fresh["members"]
    (frame,) = viewer.frames
    assert frame["leaves"] == [str(gone.pk)] and set(frame["joins"]) == {str(members[-2].pk)}
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"])

    # A newcomer joins after them all: past the full list's end.
    viewer.frames.clear()
    await store.arun(store.plans.connection(new.pk, "open", time.time(), "c"))  # online
    await store.arun(store.plans.join_room(ROOM, new.pk, "c", time.time()))
    await rooms.deliver(ROOM, {new.pk})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert str(new.pk) not in fresh["members"]
    assert {str(uid) for uid in view.listed} == set(fresh["members"])


# --- a viewer with more contacts in the room than the list has places ---------------------------


async def contacts_only_list(settings: Any) -> tuple[list[Any], Any, Viewer, RoomViews, View]:
    """Three members who joined first, then LIMIT + 3 the viewer follows, all shown to
    everyone: the viewer's list is its first LIMIT contacts, the three strangers and its last
    three contacts wait in others. (The members, the viewer, its connection, the hub's rooms,
    its view.)"""
    members, viewer_user, *_ = await one_viewer(settings, LIMIT + 6, LIMIT + 6)

    @sync_to_async
    def follow() -> None:
        Contact.objects.bulk_create(Contact(owner=viewer_user, contact=m) for m in members[3:])

    await follow()
    viewer, rooms, view = await watch(viewer_user)
    assert set(view.listed) == {m.pk for m in members[3 : 3 + LIMIT]} and view.others == 6
    return members, viewer_user, viewer, rooms, view


async def test_a_place_a_contact_frees_goes_to_the_next_contact_not_an_earlier_stranger(
    settings: Any,
) -> None:
    # The list holds contacts only: the next member a fresh read lists is the next contact,
    # though strangers joined before every contact.
    members, viewer_user, viewer, rooms, view = await contacts_only_list(settings)
    gone = members[3]
    store = get_store()
    await store.arun(store.plans.leave_room(ROOM, gone.pk, "c", time.time() - 15))
    await rooms.deliver(ROOM, {gone.pk})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    (frame,) = viewer.frames
    assert frame["leaves"] == [str(gone.pk)]
    assert set(frame["joins"]) == {str(members[3 + LIMIT].pk)}
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    assert (frame["count"], frame["others"]) == (fresh["count"], fresh["others"])


async def test_a_contact_who_joins_anew_gives_its_place_to_the_next_contact(
    settings: Any,
) -> None:
    # Its new join time puts it after the contacts waiting: the first of them takes its place
    # (not a stranger who joined before them all).
    members, viewer_user, viewer, rooms, view = await contacts_only_list(settings)
    moved = members[4]
    await join_anew(moved)
    await rooms.deliver(ROOM, {moved.pk})
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert str(moved.pk) not in fresh["members"]
    (frame,) = viewer.frames
    assert frame["leaves"] == [str(moved.pk)]
    assert set(frame["joins"]) == {str(members[3 + LIMIT].pk)}
    assert {str(uid) for uid in view.listed} == set(fresh["members"])


async def test_one_viewers_contacts_never_refill_another_viewers_list(settings: Any) -> None:
    # In one window a place frees in two full lists: viewer A's (its contacts only, who joined
    # last) and viewer B's (everyone it may see, by join time). The members after B's list are
    # hidden from B for longer than a refill's first read: B's next member is further down,
    # ahead of A's contacts, and B reads on to it; A's contacts are A's candidates alone.
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": LIMIT, "OFFLINE_GRACE": 2}
    User = get_user_model()
    hidden = 2 * LIMIT  # SCAN_FACTOR * LIMIT: the whole of a refill's first read past B's list

    @sync_to_async
    def users() -> tuple[list[Any], list[Any], Any, Any]:
        public = [User.objects.create_user(username=f"p{n}") for n in range(LIMIT + 1)]
        shy = [User.objects.create_user(username=f"s{n}") for n in range(hidden)]
        liked = [User.objects.create_user(username=f"c{n}") for n in range(LIMIT + 1)]
        a, b = User.objects.create_user(username="a"), User.objects.create_user(username="b")
        for user in [*public, *liked, a, b]:
            PrivacySettings.objects.create(user=user, online_visibility="everyone")
        Contact.objects.bulk_create(Contact(owner=a, contact=c) for c in liked)
        # public[:LIMIT], then the shy (shown to their contacts only), then B's next, then A's.
        order = [*public[:LIMIT], *shy, public[LIMIT], *liked]
        return order, liked, a, b

    order, liked, a_user, b_user = await users()
    await enter(get_store(), order, time.time() - 20, set())
    registry = Registry()
    rooms = RoomViews(registry, Groups(None, registry))
    a, b = Viewer(a_user), Viewer(b_user)
    for viewer in (a, b):
        registry.rooms.add(viewer, ROOM)  # type: ignore[arg-type]
        rooms.views[viewer] = {ROOM: View()}  # type: ignore[index]
        state = await aread_room_state(parse_room(ROOM), viewer.user)
        rooms.show(viewer, ROOM, state)  # type: ignore[arg-type]
    b_next = order[LIMIT + hidden]
    assert set(rooms.views[b][ROOM].listed) == {u.pk for u in order[:LIMIT]}  # type: ignore[index]
    assert set(rooms.views[a][ROOM].listed) == {u.pk for u in liked[:LIMIT]}  # type: ignore[index]

    store, now = get_store(), time.time()
    gone = [order[0], liked[0]]
    await store.arun(merge([store.plans.leave_room(ROOM, u.pk, "c", now - 15) for u in gone]))
    await rooms.deliver(ROOM, {u.pk for u in gone})
    for viewer, joined in ((a, liked[LIMIT]), (b, b_next)):
        fresh = await api.aroom_presence(ROOM, viewer.user)
        assert str(joined.pk) in fresh["members"]
        view = rooms.views[viewer][ROOM]  # type: ignore[index]
        assert {str(uid) for uid in view.listed} == set(fresh["members"])


async def test_a_place_redis_could_not_refill_gets_a_fresh_room_state_at_the_next_sweep(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A listed member of a full list leaves while Redis cannot answer the refill's read (too
    # slow, or down): the diff goes with the count right and the place empty, and no later
    # window would fill it (the member waiting is among no window's changed users). The next
    # sweep sends the view a fresh room_state.
    members, viewer_user, viewer, rooms, view = await one_viewer(settings, LIMIT + 3, LIMIT + 3)
    read = hub_rooms.aroom_delta

    async def refill_unread(room: Any, viewers: Any, changed: Any, *args: Any) -> Any:
        # the refill reads no changed user: the first members by join time
        return None if not changed else await read(room, viewers, changed, *args)

    monkeypatch.setattr(hub_rooms, "aroom_delta", refill_unread)
    gone = members[1]
    store, now = get_store(), time.time()
    await store.arun(store.plans.leave_room(ROOM, gone.pk, "c", now - 15))
    assert await events.asweep_rooms() == {ROOM: [gone.pk]}
    await rooms.deliver(ROOM, {gone.pk})
    (frame,) = viewer.frames
    assert frame["leaves"] == [str(gone.pk)] and not frame["joins"]
    assert (len(view.listed), view.others) == (LIMIT - 1, 3)

    monkeypatch.setattr(hub_rooms, "aroom_delta", read)
    await rooms.sweep()
    fresh = await api.aroom_presence(ROOM, viewer_user)
    assert len(fresh["members"]) == LIMIT
    state = viewer.frames[-1]
    assert state["type"] == "room_state" and set(state["members"]) == set(fresh["members"])
    assert {str(uid) for uid in view.listed} == set(fresh["members"])
    await rooms.sweep()  # once
    assert len(viewer.frames) == 2
