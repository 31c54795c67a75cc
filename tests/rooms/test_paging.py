"""Paging through a room's members (docs/rooms.md, "Paging"): ``GET rooms/<room>?after=CURSOR``
gives the next members the caller may see in the state's order, and every answer carries
``next`` (null at the end); cursors survive members coming and going, list only what the
caller may see, and a cursor the server did not give for the room is a 400 (real Redis, time
controlled with the ``clock`` fixture)."""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from presence import api
from presence.domain import InvalidInput
from presence.domain.rooms import parse_room
from presence.models import Contact, PrivacySettings
from presence.rooms import cursors
from presence.rooms.reading import WIDEST_FACTOR
from presence.store import get_store, merge
from tests.privacy_cases import quiet_login
from tests.rooms.rules import ROOMS

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]

ROOM = "post:1"


@pytest.fixture(autouse=True)
def _rooms(settings: Any, clock: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 10, "HTTP_READ_LIMIT": (10_000, 60)}


def url(room: str = ROOM) -> str:
    return f"/presence/api/rooms/{room}"


def as_user(user: Any) -> Client:
    client = Client()
    quiet_login(client, user)
    return client


def users(count: int, visibility: str | None = "everyone") -> list[Any]:
    """``count`` users (one query), showing their online status to ``visibility``."""
    model = get_user_model()
    start = model.objects.count()
    made = model.objects.bulk_create(
        [model(username=f"pager{start + n}-{time.monotonic_ns()}") for n in range(count)]
    )
    made = list(model.objects.filter(username__in=[u.username for u in made]).order_by("pk"))
    if visibility is not None:
        PrivacySettings.objects.bulk_create(
            [PrivacySettings(user=user, online_visibility=visibility) for user in made]
        )
    return made


def enter(
    members: list[Any],
    room: str = ROOM,
    same_ms: bool = False,
    *,
    public: bool = True,
    invisible: bool = False,
) -> None:
    """Each member seen now and in ``room``, a millisecond after the one before (all in one
    millisecond with ``same_ms``); ``public`` and ``invisible`` as a socket's join writes them
    (the member shows their online status to everyone; chose to be invisible)."""
    for user in members:
        api.touch(user)
    store = get_store()
    now = time.time()
    plans = [
        store.plans.join_room(
            room,
            user.pk,
            f"c{user.pk}",
            now if same_ms else later(now),
            invisible=invisible,
            public=public,
        )
        for user in members
    ]
    for start in range(0, len(plans), 200):
        assert all(store.run(merge(plans[start : start + 200])))


_joins = itertools.count()


def later(now: float) -> float:
    """A join time after every one before (the clock stands still)."""
    return now + next(_joins) / 1000


def leave(members: list[Any], room: str = ROOM) -> None:
    store = get_store()
    for user in members:
        store.run(store.plans.leave_room(room, user.pk, f"c{user.pk}", time.time(), at_once=True))


def key(user: Any) -> str:
    return str(user.pk)


def keys(members: list[Any]) -> list[str]:
    return [key(user) for user in members]


def first_page(client: Client, room: str = ROOM) -> dict[str, Any]:
    response = client.get(url(room))
    assert response.status_code == 200, response.content
    body = response.json()
    assert "next" in body
    return body


def next_page(client: Client, cursor: str, room: str = ROOM) -> dict[str, Any]:
    response = client.get(url(room), {"after": cursor})
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"room", "members", "others", "count", "next"}
    assert len(body["members"]) <= 10
    return body


def page_through(client: Client, room: str = ROOM, pages: int = 200) -> list[str]:
    """Every member listed, page after page, in order, until ``next`` is null."""
    body = first_page(client, room)
    listed = list(body["members"])
    for _ in range(pages):
        if body["next"] is None:
            return listed
        body = next_page(client, body["next"], room)
        listed += list(body["members"])
    raise AssertionError("the pages never ended")


def test_paging_lists_everyone_once_in_the_state_order(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    members = users(250)
    enter(members[:120])
    enter([viewer])
    enter(members[120:])
    # Two contacts, one late in the room: the state lists them after the viewer.
    Contact.objects.create(owner=viewer, contact=members[200])
    Contact.objects.create(owner=viewer, contact=members[3])
    client = as_user(viewer)
    state = first_page(client)
    # The first answer is the state (api.room_presence), with its cursor.
    assert list(state["members"]) == list(api.room_presence(ROOM, viewer)["members"])
    assert state["next"] is not None and state["count"] == 251
    listed = page_through(client)
    rest = [m for m in members if m not in (members[3], members[200])]
    assert listed == [key(viewer), key(members[3]), key(members[200]), *keys(rest)]


def test_members_of_one_millisecond_are_paged_by_id(make_user: Callable[..., Any]) -> None:
    """A burst of joins in one millisecond: the first read stops inside it (it reads by join
    time), and the pages still give each member once, by id as text."""
    viewer = make_user()
    members = users(73)
    enter(members, same_ms=True)
    listed = page_through(as_user(viewer))
    assert listed == sorted(keys(members))


def test_members_come_and_go_between_pages(make_user: Callable[..., Any], clock: Any) -> None:
    viewer = make_user()
    members = users(60)
    enter(members)
    client = as_user(viewer)
    body = first_page(client)
    seen = list(body["members"])
    assert seen == keys(members[:10])
    # Before the next page: a listed member and members not listed yet leave, others join.
    clock.shift(1)
    gone = [members[0], members[15], members[16], members[40]]
    leave(gone)
    newcomers = users(5)
    enter(newcomers)
    body = next_page(client, body["next"])
    seen += list(body["members"])
    clock.shift(1)
    leave([members[25], members[59]])
    # One of the first members leaves and comes back: a new stay, at the end of the room.
    leave([members[1]])
    enter([members[1]])
    while body["next"] is not None:
        body = next_page(client, body["next"])
        seen += list(body["members"])
    # No one twice, but the member who came back (listed before it left, and after).
    assert len(seen) == len(set(seen)) + 1 and seen.count(key(members[1])) == 2
    stayed = [m for m in members if m not in (*gone, members[25], members[59], members[1])]
    assert set(keys(stayed)) <= set(seen)
    assert not {key(members[15]), key(members[16]), key(members[40]), key(members[25])} & set(seen)
    # The newcomers joined after the pages' place: they come last, in join order.
    assert seen[-6:] == [*keys(newcomers), key(members[1])]
    # Those who stayed, in the state's order.
    order = [k for k in seen if k in set(keys(stayed))]
    assert order == keys(stayed)


def test_a_viewer_pages_only_through_the_members_they_may_see(
    make_user: Callable[..., Any],
) -> None:
    viewer = make_user()
    public = users(30)
    hidden = users(30, "nobody")
    contacts_only = users(30, None)  # the default: their contacts
    friends = contacts_only[::3]
    for friend in friends:
        Contact.objects.create(owner=friend, contact=viewer)
    mixed = [user for trio in zip(public, hidden, contacts_only, strict=True) for user in trio]
    enter(mixed)
    listed = page_through(as_user(viewer))
    visible = set(keys(public)) | set(keys(friends))
    assert len(listed) == len(set(listed)) == len(visible)
    assert set(listed) == visible
    assert listed == [k for k in keys(mixed) if k in visible]


def test_a_stranger_reads_on_past_members_hidden_from_them(
    make_user: Callable[..., Any], settings: Any
) -> None:
    """Few visible members, far apart: pages may list nobody yet carry a ``next`` (each read
    goes at most WIDEST_FACTOR x ROOM_LIST_LIMIT past its cursor), and the stranger gets to
    all of them, none of the hidden ones."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 2, "HTTP_READ_LIMIT": (10_000, 60)}
    stranger = make_user()
    members = users(400, None)
    shown = [members[5], members[150], members[151], members[390]]
    PrivacySettings.objects.bulk_create(
        [PrivacySettings(user=user, online_visibility="everyone") for user in shown]
    )
    enter(members)
    client = as_user(stranger)
    body = first_page(client)
    pages = [list(body["members"])]
    while body["next"] is not None:
        body = next_page(client, body["next"])
        assert body["count"] == 400
        pages.append(list(body["members"]))
    assert [k for page in pages for k in page] == keys(shown)
    assert [] in pages  # a page that read on without finding anyone to list
    assert len(pages) <= 1 + 400 // (WIDEST_FACTOR * 2) + 3


def test_a_member_found_by_their_tie_far_down_the_room_skips_no_one_before_them(
    make_user: Callable[..., Any], settings: Any
) -> None:
    """A first read lists a member who shows the viewer their online status (they have the
    viewer among their contacts) wherever they joined, past the public members it read: the
    cursor still starts where that read stopped, so a public member who joined in between
    comes on a later page, and the member found by their tie is not listed again."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 2, "HTTP_READ_LIMIT": (10_000, 60)}
    viewer = make_user()
    # As many members in the room's index of public ones as the widest first read reads,
    # none of them listed: each showed everyone their online status when they joined, and
    # nobody since (the index holds them until they join again; the resolver decides)
    unlisted = users(WIDEST_FACTOR * 2, "nobody")
    public, admitting = users(1)[0], users(1, None)[0]
    Contact.objects.create(owner=admitting, contact=viewer)
    enter(unlisted)
    enter([public])
    enter([admitting], public=False)
    client = as_user(viewer)
    state = first_page(client)
    assert list(state["members"]) == [key(admitting)] and state["next"] is not None
    listed = page_through(client)
    assert sorted(listed) == sorted([key(public), key(admitting)])
    assert len(listed) == 2


def test_where_pages_end_tells_nothing_of_an_invisible_member(
    make_user: Callable[..., Any], settings: Any
) -> None:
    """Two rooms alike but for an invisible member (neither listed nor counted) just before
    the last visible one: a stranger's pages list the same members on the same pages, with
    the same counts, wherever a read's reach ends (each read reads 64 members at its widest)."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 2, "HTTP_READ_LIMIT": (10_000, 60)}
    stranger = make_user()
    client = as_user(stranger)
    reach = WIDEST_FACTOR * 2
    for hidden in range(reach - 3, reach + 1):
        pages = []
        for room, with_invisible in ((f"post:{hidden}0", False), (f"post:{hidden}1", True)):
            shown, nobody, last = users(2), users(hidden, "nobody"), users(1)
            enter(shown, room)
            enter(nobody, room)
            if with_invisible:
                invisible = users(1)
                PrivacySettings.objects.filter(user__in=invisible).update(invisible=True)
                enter(invisible, room, invisible=True)
            enter(last, room)
            body = first_page(client, room)
            order = [(len(body["members"]), body["count"], body["next"] is None)]
            while body["next"] is not None and len(order) < 10:
                body = next_page(client, body["next"], room)
                order.append((len(body["members"]), body["count"], body["next"] is None))
            pages.append(order)
        assert pages[0] == pages[1], hidden


def test_a_run_of_invisible_members_cannot_make_a_read_take_the_whole_room() -> None:
    """Invisible members take no place in a read's reach, up to as many again: a read or a
    page of ``first`` reads at most twice as many members, however many invisible ones come
    first."""
    hidden, shown = users(100), users(3)
    PrivacySettings.objects.filter(user__in=hidden).update(invisible=True)
    enter(hidden, invisible=True)
    enter(shown)
    store, now = get_store(), time.time()
    first = store.run(store.plans.read_room(ROOM, now, 4, (), True))
    assert first is not None and len(first.members) == 8 and not first.complete
    page = store.run(store.plans.read_room_page(ROOM, now, 4, None))
    assert page is not None and len(page.read.members) == 8 and not page.done


def test_a_page_asks_the_rule_and_needs_a_login(make_user: Callable[..., Any]) -> None:
    user = make_user()
    enter(users(15), room="group:2")
    cursor = first_page(as_user(user), "group:2")["next"]
    assert cursor is not None
    assert Client().get(url("group:2"), {"after": cursor}).status_code == 401
    assert next_page(as_user(make_user()), cursor, "group:2")["members"]
    # A cursor of a room whose rule refuses the caller: 403, nothing listed.
    refused = cursors.encode(parse_room("group:3"), cursors.Cursor(cursors.START))
    response = as_user(user).get(url("group:3"), {"after": refused})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def assert_bad_cursor(response: Any) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_value"
    assert "after" in error["message"] or "cursor" in error["message"]


def test_a_cursor_the_server_did_not_give_for_the_room_is_400(
    make_user: Callable[..., Any], settings: Any
) -> None:
    viewer = make_user()
    enter(users(30))
    enter(users(30), room="post:2")
    client = as_user(viewer)
    good = first_page(client)["next"]
    other_room = first_page(client, "post:2")["next"]
    for bad in [
        "",
        "garbage",
        "!!!not base64!!!",
        "é" * 20,
        other_room,  # another room's
        good[:-2],  # cut short
        good[:10] + ("A" if good[10] != "A" else "B") + good[11:],  # tampered
        good + "AAAA",
        "A" * (cursors.max_length() + 1),  # oversized
        base64.urlsafe_b64encode(b"\0" * 64).decode(),
    ]:
        assert_bad_cursor(client.get(url(), {"after": bad}))
    assert next_page(client, good)["members"]
    # Another server's (another SECRET_KEY): not this server's cursor.
    settings.SECRET_KEY = "another-" + settings.SECRET_KEY
    with pytest.raises(InvalidInput) as refused:
        api.room_page(ROOM, viewer, good)
    assert refused.value.code == "invalid_value"


def test_cursors_are_opaque_and_bound_to_their_room() -> None:
    room, other = parse_room("post:1"), parse_room("post:2")
    cursor = cursors.Cursor((cursors.PHASE_OTHER, 1234.0, "42"), frozenset({cursors.digest("7")}))
    text = cursors.encode(room, cursor)
    assert cursors.decode(room, text) == cursor
    assert "42" not in base64.urlsafe_b64decode(text + "==").decode("latin-1")
    assert cursors.encode(room, cursor) != text  # a fresh nonce each time
    with pytest.raises(InvalidInput):
        cursors.decode(other, text)
    for wrong_type in (None, 5, ["x"], {"a": 1}):
        with pytest.raises(InvalidInput):
            cursors.decode(room, wrong_type)


def test_a_cursor_leaves_out_the_members_listed_ahead_of_it_on_every_page() -> None:
    listed_ahead = frozenset({cursors.digest("90"), cursors.digest("91")})
    cursor = cursors.Cursor(
        (cursors.PHASE_OTHER, 1234.0, ""), frozenset({cursors.digest("7")}), listed_ahead
    )
    room = parse_room("post:1")
    assert cursors.decode(room, cursors.encode(room, cursor)) == cursor
    other = cursors.PHASE_OTHER
    assert not cursor.passes((other, 1234.0, "7"))  # seen in its millisecond
    assert cursor.passes((other, 1234.0, "8"))
    assert not cursor.passes((other, 9999.0, "90"))  # listed ahead, wherever it comes
    assert cursor.passes((other, 1233.0 + 2, "7"))  # a later millisecond: not the one seen
    following = cursor.following((other, 2000.0, "12"))
    assert following.seen == frozenset() and following.ahead == listed_ahead
    assert not following.passes((other, 9999.0, "91")) and following.passes((other, 9999.0, "92"))


def test_pages_count_against_the_read_limit(make_user: Callable[..., Any], settings: Any) -> None:
    # Room for two reads (each counts as ROOM_LIST_LIMIT ids, at least READ_MIN_IDS): the
    # state and one page.
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 10, "HTTP_READ_LIMIT": (50, 60)}
    viewer = make_user()
    enter(users(40))
    client = as_user(viewer)
    cursor = first_page(client)["next"]
    body = next_page(client, cursor)
    response = client.get(url(), {"after": body["next"]})
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"


def test_every_answer_carries_next(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    client = as_user(viewer)
    # An empty room and a small one: complete at once.
    assert first_page(client)["next"] is None
    assert api.room_presence(ROOM, viewer)["next"] is None
    enter(users(3))
    assert first_page(client)["next"] is None
    assert api.room_presence(ROOM, viewer)["next"] is None
    enter(users(17))
    assert api.room_presence(ROOM, viewer)["next"] is not None
    last = next_page(client, first_page(client)["next"])
    assert len(last["members"]) == 10 and last["count"] == 20
    # A full page: the next one may hold someone, and it is empty, the end.
    assert last["next"] is not None
    end = api.room_page(ROOM, viewer, last["next"])
    assert end == {"room": ROOM, "members": {}, "others": 20, "count": 20, "next": None}
