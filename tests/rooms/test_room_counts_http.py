"""``GET presence/api/room_counts?room=...``: many rooms' counts in one read, what presence.js
polls without a socket; each the count ``room_counts`` gives (``{% room_count %}``'s), one id
per room against HTTP_READ_LIMIT; 400 / 401 / 405 / 503 in JSON, a room the viewer may not see
null."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.urls import reverse

from presence import api
from presence.models import Block
from tests.privacy_cases import quiet_login
from tests.rooms import rules
from tests.rooms.members import enter
from tests.rooms.rules import ROOMS
from tests.rooms.test_rooms_http import assert_error

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]

URL = "/presence/api/room_counts"
REVOCABLE = {**ROOMS, "club": "tests.rooms.rules.revocable"}


@pytest.fixture(autouse=True)
def _rooms(settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS}


def as_user(user: Any) -> Client:
    client = Client()
    quiet_login(client, user)
    return client


def counts_of(client: Client, *rooms: str) -> Any:
    return client.get(URL, {"room": list(rooms)})


def test_the_url_is_named() -> None:
    assert reverse("presence:room_counts") == URL


def test_each_rooms_count_as_the_viewer_may_see_it(make_user: Callable[..., Any]) -> None:
    viewer, ann, ben, blocker = (make_user() for _ in range(4))
    Block.objects.create(blocker=blocker, blocked=viewer)
    for user in (ann, ben, blocker):
        enter(user, "post:1")
    enter(ann, "post:a/b")
    response = counts_of(as_user(viewer), "post:1", "post:a/b", "post:9", "post:1")
    assert response.status_code == 200, response.content
    assert response.json() == {"counts": {"post:1": 2, "post:a/b": 1, "post:9": 0}}
    assert response.json()["counts"] == api.room_counts(["post:1", "post:a/b", "post:9"], viewer)
    assert "no-cache" in response["Cache-Control"]  # the viewer's own counts


def test_anonymous_callers_get_401_and_only_get(
    client: Client, make_user: Callable[..., Any]
) -> None:
    assert_error(counts_of(client, "post:1"), 401, "not_authenticated")
    response = as_user(make_user()).post(URL, {"room": "post:1"})
    assert_error(response, 405, "method_not_allowed")


@pytest.mark.parametrize("room", ["post", "Post:1", "post:", "post:a b", "post:" + "x" * 65])
def test_a_malformed_name_is_400_naming_nothing_read(
    room: str, settings: Any, make_user: Callable[..., Any]
) -> None:
    # A budget of one read of one room: the refused reads before it must not spend it.
    settings.PRESENCE = {"ROOMS": ROOMS, "HTTP_READ_LIMIT": (1, 60)}
    client = as_user(make_user())
    for _ in range(3):
        assert_error(counts_of(client, "post:1", room), 400, "invalid_value")
    assert_error(client.get(URL), 400, "missing_rooms")
    assert counts_of(client, "post:1").status_code == 200


def test_at_most_room_list_limit_rooms(settings: Any, make_user: Callable[..., Any]) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 3}
    client = as_user(make_user())
    assert counts_of(client, "post:1", "post:2", "post:3", "post:1").status_code == 200
    assert_error(counts_of(client, "post:1", "post:2", "post:3", "post:4"), 400, "too_many_rooms")


def test_a_refused_room_or_an_undeclared_kind_is_null_the_others_counted(
    make_user: Callable[..., Any],
) -> None:
    """A page polls all its counts in one request: a room the viewer may not see is null (the
    tag shows it as nothing), not a refusal of the batch, which would stop every other count."""
    viewer, ann = make_user(), make_user()
    enter(ann, "post:1")
    enter(ann, "group:3")
    response = counts_of(as_user(viewer), "post:1", "group:2", "group:3", "lobby:1")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "counts": {"post:1": 1, "group:2": 0, "group:3": None, "lobby:1": None}
    }


def test_a_room_taken_away_after_the_page_rendered_leaves_the_others_counted(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {"ROOMS": REVOCABLE}
    viewer, ann = make_user(), make_user()
    enter(ann, "post:1")
    enter(ann, "club:1")
    client = as_user(viewer)
    assert counts_of(client, "post:1", "club:1").json() == {"counts": {"post:1": 1, "club:1": 1}}
    rules.refused.add((viewer.pk, "1"))
    try:
        response = counts_of(client, "post:1", "club:1")
    finally:
        rules.refused.clear()
        rules.asked.clear()
    assert response.status_code == 200, response.content
    assert response.json() == {"counts": {"post:1": 1, "club:1": None}}


def test_a_count_costs_one_id_per_room_of_the_read_limit(
    settings: Any, clock: time_machine.Coordinates, make_user: Callable[..., Any]
) -> None:
    """A count lists no member: one id per distinct room (at least READ_MIN_IDS, as every
    read), not ROOM_LIST_LIMIT as a room's read."""
    settings.PRESENCE = {"ROOMS": ROOMS, "HTTP_READ_LIMIT": (100, 60)}
    client = as_user(make_user())
    rooms = [f"post:{n}" for n in range(30)]
    for _ in range(3):
        assert counts_of(client, *rooms, *rooms).status_code == 200  # 30 ids each
    response = counts_of(client, *rooms)
    assert_error(response, 429, "rate_limited")
    assert response["Retry-After"] == "60"
    clock.shift(60)
    assert counts_of(client, *rooms).status_code == 200


def test_polling_thirteen_rooms_every_fifteen_seconds_fits_the_default_limit(
    settings: Any, clock: time_machine.Coordinates, make_user: Callable[..., Any]
) -> None:
    client = as_user(make_user())
    rooms = [f"post:{n}" for n in range(13)]
    for _ in range(4 * 10):  # ten minutes of polls
        assert counts_of(client, *rooms).status_code == 200
        clock.shift(15)
