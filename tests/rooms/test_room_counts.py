"""room_counts: many rooms' counts for one viewer in one Redis round trip, each the count
room_presence gives that viewer (the privacy matrix), the same refusals, bounded; and the
``{% room_count %}`` / ``{% prefetch_room_counts %}`` tags by exact HTML."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.template import Context, Template
from django.test import RequestFactory

from presence import api
from presence.domain import InvalidInput
from presence.models import Block, Contact, PrivacySettings
from presence.store import get_store
from tests.privacy_cases import count_round_trips
from tests.rooms.rules import ROOMS

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]

ROOM, OTHER, EMPTY = "post:1", "post:2", "post:3"


@pytest.fixture(autouse=True)
def _rooms(settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS}


def enter(user: Any, room: str = ROOM, invisible: bool = False) -> None:
    """``user`` online (a page view) and in ``room`` (a connection's join)."""
    store = get_store()
    api.touch(user)
    plan = store.plans.join_room(room, user.pk, f"c{user.pk}", time.time(), invisible=invisible)
    assert store.run(plan) is not None


@pytest.fixture
def matrix(make_user: Callable[..., Any]) -> dict[str, Any]:
    """Members of ROOM (and some of OTHER) in every privacy case for ``viewer``."""
    users = {
        name: make_user()
        for name in (
            "viewer",
            "public",  # everyone may see them online
            "contact",  # the viewer's contact, and has the viewer as theirs
            "stranger",  # default privacy, no tie: hidden, counted
            "nobody",  # online_visibility nobody: hidden, counted
            "invisible",  # neither listed nor counted
            "blocked_by_viewer",
            "blocks_viewer",
        )
    }
    PrivacySettings.objects.create(user=users["public"], online_visibility="everyone")
    PrivacySettings.objects.create(user=users["nobody"], online_visibility="nobody")
    PrivacySettings.objects.create(
        user=users["invisible"], online_visibility="everyone", invisible=True
    )
    Contact.objects.create(owner=users["viewer"], contact=users["contact"])
    Contact.objects.create(owner=users["contact"], contact=users["viewer"])
    Block.objects.create(blocker=users["viewer"], blocked=users["blocked_by_viewer"])
    Block.objects.create(blocker=users["blocks_viewer"], blocked=users["viewer"])
    for name, user in users.items():
        enter(user, invisible=name == "invisible")
    for name in ("public", "blocks_viewer", "invisible", "stranger"):
        enter(users[name], OTHER, invisible=name == "invisible")
    return users


def test_each_count_is_room_presences_for_every_viewer(matrix: dict[str, Any]) -> None:
    rooms = [ROOM, OTHER, EMPTY]
    for name, viewer in matrix.items():
        counts = api.room_counts(rooms, viewer)
        expected = {room: api.room_presence(room, viewer)["count"] for room in rooms}
        assert counts == expected, name
    # What the matrix makes of it: 8 members, the invisible one never counted but by
    # themselves, a block either way between the viewer and two of them.
    assert api.room_counts(rooms, matrix["viewer"]) == {ROOM: 5, OTHER: 2, EMPTY: 0}
    assert api.room_counts(rooms, matrix["stranger"]) == {ROOM: 7, OTHER: 3, EMPTY: 0}
    assert api.room_counts(rooms, matrix["invisible"]) == {ROOM: 8, OTHER: 4, EMPTY: 0}
    assert api.room_counts([ROOM], matrix["blocks_viewer"]) == {ROOM: 6}


def test_an_invisible_viewer_counts_themselves(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    PrivacySettings.objects.create(user=viewer, invisible=True)
    enter(viewer, invisible=True)
    assert (
        api.room_counts([ROOM], viewer)
        == {ROOM: 1}
        == {ROOM: api.room_presence(ROOM, viewer)["count"]}
    )


def test_rooms_named_either_way_each_once_by_name(matrix: dict[str, Any]) -> None:
    viewer = matrix["viewer"]
    counts = api.room_counts([("post", 1), ROOM, ("post", "2")], viewer)
    assert counts == {ROOM: 5, OTHER: 2}
    assert async_to_sync(api.aroom_counts)([ROOM, OTHER], viewer) == counts


def test_every_room_in_one_round_trip(matrix: dict[str, Any]) -> None:
    viewer = matrix["viewer"]
    rooms = [f"post:{n}" for n in range(1, 21)]
    api.room_counts(rooms, viewer)  # (the scripts loaded)
    with count_round_trips() as trips:
        counts = api.room_counts(rooms, viewer)
    assert trips.count == 1
    assert counts[ROOM] == 5 and counts[OTHER] == 2 and sum(counts.values()) == 7


def test_refused_as_room_presence_is(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    enter(viewer, "group:2")
    # The rule refuses odd groups: PermissionDenied, as room_presence raises, for the batch.
    with pytest.raises(PermissionDenied):
        api.room_presence("group:1", viewer)
    with pytest.raises(PermissionDenied, match="group:1"):
        api.room_counts(["group:2", "group:1"], viewer)
    with pytest.raises(PermissionDenied):
        api.room_counts(["group:2"], AnonymousUser())
    assert api.room_counts(["group:2"], viewer) == {"group:2": 1}


def test_bad_names_and_unknown_kinds_raise_before_any_read(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    with pytest.raises(api.UnknownRoom):
        api.room_counts([ROOM, "nosuchkind:1"], viewer)
    with pytest.raises(InvalidInput) as bad:
        api.room_counts([ROOM, "not a room"], viewer)
    assert bad.value.code == "invalid_value"
    # One room's name is not a list of rooms.
    for one in (ROOM, ("post", 1)):
        with pytest.raises(InvalidInput):
            api.room_counts(one, viewer)
    assert api.room_counts([], viewer) == {}


def test_at_most_room_list_limit_rooms(make_user: Callable[..., Any], settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 3}
    viewer = make_user()
    assert api.room_counts(["post:1", "post:2", "post:3", "post:1"], viewer) == {
        "post:1": 0,
        "post:2": 0,
        "post:3": 0,
    }
    with pytest.raises(InvalidInput, match="At most 3 rooms") as many:
        api.room_counts(["post:1", "post:2", "post:3", "post:4"], viewer)
    assert many.value.code == "too_many_rooms"


# --- the template tags --------------------------------------------------------------------------


def render(source: str, viewer: Any, **context: Any) -> str:
    request = RequestFactory().get("/")
    request.user = viewer
    template = Template("{% load presence %}" + source)
    return template.render(Context({"request": request, **context}))


def count_html(count: int, room: str, limit: int = 100) -> str:
    """What {% room_count %} renders: the count, in an element presence.js keeps live by the
    room's name (watch_room_count), polling the counts endpoint without a socket (``limit``
    rooms a request: ROOM_LIST_LIMIT)."""
    return (
        f'<span class="presence-room-count" data-presence-room-count-of="{room}"'
        f' data-presence-room-counts-endpoint="/presence/api/room_counts"'
        f' data-presence-room-counts-limit="{limit}">{count}</span>'
    )


def test_the_tag_shows_the_viewers_count(matrix: dict[str, Any]) -> None:
    viewer = matrix["viewer"]
    assert render('{% room_count "post:1" %}', viewer) == count_html(5, "post:1")
    assert render('{% room_count "post" 2 %}', viewer) == count_html(2, "post:2")
    assert render('{% room_count "post" 3 %}', viewer) == count_html(0, "post:3")
    assert render('{% room_count "post:1" %}', matrix["stranger"]) == count_html(7, "post:1")
    assert render('{% room_count "post:1" as n %}{{ n }} here', viewer) == "5 here"


def test_the_tag_shows_nothing_of_a_room_the_viewer_may_not_see(
    make_user: Callable[..., Any],
) -> None:
    viewer = make_user()
    enter(viewer, "group:2")
    for room in ('"group:1"', '"nosuchkind:1"', '"not a room"', '"group" 1'):
        assert render(f"{{% room_count {room} %}}", viewer) == ""
        assert render(f"{{% room_count {room} as n %}}[{{{{ n }}}}]", viewer) == "[]"
    assert render('{% room_count "group:2" %}', AnonymousUser()) == ""
    assert render('{% room_count "group:2" %}', viewer) == count_html(1, "group:2")


def test_prefetched_counts_cost_nothing_more(matrix: dict[str, Any]) -> None:
    viewer = matrix["viewer"]
    source = (
        '{% prefetch_room_counts "post" ids %}'
        '{% for id in ids %}{% room_count "post" id %};{% endfor %}'
    )
    render(source, viewer, ids=[1, 2, 3])  # (the scripts loaded)
    with count_round_trips() as trips:
        html = render(source, viewer, ids=[1, 2, 3, "not an id"])
    assert trips.count == 1
    assert html == f"{count_html(5, ROOM)};{count_html(2, OTHER)};{count_html(0, EMPTY)};;"
    # Objects by their pk, and names (the malformed, undeclared and refused left out).
    topics = [SimpleNamespace(pk=1), SimpleNamespace(pk=2)]
    by_pk = '{% prefetch_room_counts "post" topics %}{% room_count "post" topics.1.pk %}'
    assert render(by_pk, viewer, topics=topics) == count_html(2, OTHER)
    names = ["post:1", "nosuchkind:1", "group:1", "not a room"]
    by_name = '{% prefetch_room_counts names %}{% room_count "post:1" %}'
    assert render(by_name, viewer, names=names) == count_html(5, ROOM)


def test_prefetch_reads_a_page_past_the_limit_in_batches(
    matrix: dict[str, Any], settings: Any
) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 2}
    viewer = matrix["viewer"]
    source = (
        '{% prefetch_room_counts "post" ids %}'
        '{% for id in ids %}{% room_count "post" id %};{% endfor %}'
    )
    render(source, viewer, ids=[1, 2, 3])
    with count_round_trips() as trips:
        html = render(source, viewer, ids=[1, 2, 3])
    assert trips.count == 2
    shown = [count_html(5, ROOM, 2), count_html(2, OTHER, 2), count_html(0, EMPTY, 2)]
    assert html == "".join(f"{each};" for each in shown)
