"""``GET presence/api/rooms/<room>``: the room as the caller may see it, with the members'
names; 401 / 400 / 403 / 404 / 405 in JSON; HTTP_READ_LIMIT; privacy per viewer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.urls import reverse

from presence.models import Block, Contact, PrivacySettings
from presence.rooms import rule
from tests.privacy_cases import quiet_login
from tests.rooms.members import enter
from tests.rooms.rules import ROOMS, WITH_A_MISSING_RULE

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]


@pytest.fixture(autouse=True)
def _rooms(settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS}


def url(room: str) -> str:
    return f"/presence/api/rooms/{room}"


def as_user(user: Any) -> Client:
    client = Client()
    quiet_login(client, user)
    return client


def assert_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]


def test_the_url_is_named() -> None:
    assert reverse("presence:room", args=["post:42"]) == url("post:42")
    assert reverse("presence:room", args=["page:/about/"]) == url("page:/about/")


def test_anonymous_callers_get_401_in_json(client: Client) -> None:
    assert_error(client.get(url("post:1")), 401, "not_authenticated")


def test_only_get(make_user: Callable[..., Any]) -> None:
    response = as_user(make_user()).post(url("post:1"))
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET"


@pytest.mark.parametrize(
    "room",
    ["post", "Post:1", "post:", ":1", "1post:1", "post:a%20b", "post:" + "x" * 65, "post:a%09b"],
)
def test_a_malformed_name_is_400_and_costs_no_read(
    room: str, settings: Any, make_user: Callable[..., Any]
) -> None:
    # A budget of one room read: the malformed reads before it must not spend it.
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 100, "HTTP_READ_LIMIT": (100, 60)}
    client = as_user(make_user())
    for _ in range(3):
        assert_error(client.get(url(room)), 400, "invalid_value")
    assert client.get(url("post:1")).status_code == 200


def test_an_undeclared_kind_is_404(make_user: Callable[..., Any]) -> None:
    assert_error(as_user(make_user()).get(url("lobby:1")), 404, "unknown_room")


def test_where_the_rule_refuses_or_raises_403(make_user: Callable[..., Any]) -> None:
    client = as_user(make_user())
    assert client.get(url("group:2")).status_code == 200  # even ids only
    assert_error(client.get(url("group:3")), 403, "forbidden")
    assert_error(client.get(url("broken:1")), 403, "forbidden")


def test_where_the_rule_does_not_import_403(
    make_user: Callable[..., Any], settings: Any, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PRESENCE = {"ROOMS": WITH_A_MISSING_RULE}
    monkeypatch.setattr(rule, "_TOLD", set())  # (not told yet by an earlier test)
    client = as_user(make_user())
    assert_error(client.get(url("missing:1")), 403, "forbidden")
    assert_error(client.get(url("missing:2")), 403, "forbidden")
    assert_error(client.get(url("relative:1")), 403, "forbidden")
    assert_error(client.get(url("raising:1")), 403, "forbidden")
    assert client.get(url("post:1")).status_code == 200  # the other kinds are as they were
    assert caplog.text.count("does not import") == 3  # once per path, not per request


def test_a_refused_room_tells_nothing_of_its_members(make_user: Callable[..., Any]) -> None:
    ann, ben = make_user("ann"), make_user("ben")
    Contact.objects.create(owner=ann, contact=ben)
    enter(ann, "group:3")
    response = as_user(ben).get(url("group:3"))
    assert_error(response, 403, "forbidden")
    assert b"ann" not in response.content and str(ann.pk).encode() not in response.content


def test_each_viewer_sees_the_members_privacy_lets_them_see(
    make_user: Callable[..., Any],
) -> None:
    ann = make_user("ann", first_name="Ann", last_name="Smith")
    ben, cy, dan, eve = (make_user(name) for name in ("ben", "cy", "dan", "eve"))
    Contact.objects.create(owner=ann, contact=ben)  # ann lets ben see her (contacts)
    PrivacySettings.objects.create(user=dan, invisible=True)
    Block.objects.create(blocker=eve, blocked=ben)
    for user in (ann, cy, dan, eve):
        meta = {"mode": "reading"} if user == ann else None
        enter(user, "post:7", meta=meta, invisible=user == dan)

    body = as_user(ben).get(url("post:7")).json()
    assert set(body) == {"room", "members", "others", "count", "next"}
    assert body["next"] is None  # every member is read: no page follows
    assert body["room"] == "post:7"
    # ann listed, with her name; cy present but hidden from ben: others; dan (invisible) and
    # eve (a block between her and ben) neither listed nor counted.
    assert list(body["members"]) == [str(ann.pk)]
    member = body["members"][str(ann.pk)]
    assert member["name"] == "Ann Smith"
    assert member["meta"] == {"mode": "reading"}
    assert member["presence"]["status"] == "online"
    assert (body["others"], body["count"]) == (1, 2)

    # cy: only cy is listed (nobody lets cy see them online); ann and eve count in others;
    # dan, invisible, is not counted for cy either.
    cy_view = as_user(cy).get(url("post:7")).json()
    assert str(cy.pk) in cy_view["members"]  # the viewer is listed to themselves
    assert str(ann.pk) not in cy_view["members"]
    assert cy_view["count"] == 3  # ann, cy, eve; never dan
    assert cy_view["members"][str(cy.pk)]["name"] == "cy"  # no full name: the username


def test_a_room_id_may_hold_a_slash(make_user: Callable[..., Any]) -> None:
    ann, ben = make_user("ann"), make_user("ben")
    Contact.objects.create(owner=ann, contact=ben)
    enter(ann, "post:a/b")
    body = as_user(ben).get(url("post:a/b")).json()
    assert body["room"] == "post:a/b"
    assert list(body["members"]) == [str(ann.pk)]
    assert as_user(ben).get(url("post:a%2Fb")).json() == body


def test_room_reads_count_against_the_read_limit(
    settings: Any, clock: time_machine.Coordinates, make_user: Callable[..., Any]
) -> None:
    # A room read counts as ROOM_LIST_LIMIT ids: two fit in 250, the third does not.
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 100, "HTTP_READ_LIMIT": (250, 60)}
    client = as_user(make_user())
    assert client.get(url("post:1")).status_code == 200
    assert client.get(url("post:1")).status_code == 200
    response = client.get(url("post:1"))
    assert_error(response, 429, "rate_limited")
    assert response["Retry-After"] == "60"
    clock.shift(60)
    assert client.get(url("post:1")).status_code == 200
