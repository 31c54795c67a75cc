"""``{% room_presence %}`` by exact HTML: who is here as the viewer may see them, the count,
the two ways to name a room, meta, languages; nothing at all where the viewer may not see the
room."""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.template import Context, Template
from django.test import Client, RequestFactory
from django.utils import translation

from presence.models import Contact
from tests.rooms.members import enter
from tests.rooms.rules import ROOMS, WITH_A_MISSING_RULE

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]


@pytest.fixture(autouse=True)
def _rooms(settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS}


def render(source: str, viewer: Any, **context: Any) -> str:
    request = RequestFactory().get("/")
    request.user = viewer
    template = Template("{% load presence %}" + source)
    return template.render(Context({"request": request, **context}))


def room_html(
    room: str, viewer: Any, members: str = "", others: int = 0, count: int = 0, meta: str = ""
) -> str:
    endpoint = f"/presence/api/rooms/{room}"
    return (
        f'<div class="presence-room" data-presence-room="{room}" '
        f'data-presence-room-endpoint="{endpoint}" data-presence-room-viewer="{viewer.pk}" '
        f'data-presence-room-viewer-name="{viewer.get_username()}"{meta}>'
        f'<ul class="presence-room__members" data-presence-room-members>{members}</ul>'
        '<span class="presence-room__others" data-presence-room-others '
        f'title="More people are here"{"" if others else " hidden"}>+{others}</span>'
        '<span class="presence-room__count">Here now: '
        f"<span data-presence-room-count>{count}</span></span></div>"
    )


def member_html(user: Any, initials: str, name: str, status: str = "online") -> str:
    label = {"online": "Online", "offline": "Offline"}[status]
    return (
        f'<li class="presence-room__member" data-presence-room-member="{user.pk}">'
        f'<span class="presence-room__avatar" aria-hidden="true">{initials}</span>'
        f'<span class="presence-dot presence-dot--{status}" data-presence-user="{user.pk}" '
        f'title="{label}" aria-label="{label}" role="img"></span> '
        f'<span class="presence-room__name">{name}</span></li>'
    )


def test_an_empty_room(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    assert render('{% room_presence "post:1" %}', viewer) == room_html("post:1", viewer)


def test_who_is_here_as_the_viewer_may_see_them(make_user: Callable[..., Any]) -> None:
    ann = make_user("ann", first_name="Ann", last_name="Smith")
    ben, cy = make_user("ben"), make_user("cy")
    Contact.objects.create(owner=ann, contact=ben)  # ann lets ben see her; cy lets nobody
    enter(ann, "post:42")
    enter(cy, "post:42")
    html = render('{% room_presence "post:42" %}', ben)
    assert html == room_html("post:42", ben, member_html(ann, "AS", "Ann Smith"), others=1, count=2)
    # Nothing of cy but the number: neither her id nor her name.
    assert f'"{cy.pk}"' not in html and "cy" not in html.replace("presence-", "")


def test_the_kind_and_the_id_as_two_arguments(make_user: Callable[..., Any]) -> None:
    ann, ben = make_user("ann"), make_user("ben")
    Contact.objects.create(owner=ann, contact=ben)
    enter(ann, "post:42")
    two = render('{% room_presence "post" post_id %}', ben, post_id=42)
    assert two == render('{% room_presence "post:42" %}', ben)
    assert two == room_html("post:42", ben, member_html(ann, "AN", "ann"), count=1)


def test_meta_for_the_pages_join(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    html = render('{% room_presence "post:1" meta=mode %}', viewer, mode={"mode": "edit"})
    meta = ' data-presence-room-meta="{&quot;mode&quot;:&quot;edit&quot;}"'
    assert html == room_html("post:1", viewer, meta=meta)


def fetched_path(endpoint: str) -> str:
    """The path a browser fetches for an endpoint given as an absolute path, as the URL standard
    parses it: "\\" is a "/", the "." and ".." segments (also spelt "%2e") are resolved, the
    path ends at a "?" or "#"."""
    path = re.split(r"[?#]", endpoint, maxsplit=1)[0].replace("\\", "/")
    segments = path.split("/")[1:]
    resolved: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment.lower() in ("..", ".%2e", "%2e.", "%2e%2e"):
            if resolved:
                resolved.pop()
            if last:
                resolved.append("")
        elif segment.lower() in (".", "%2e"):
            if last:
                resolved.append("")
        else:
            resolved.append(segment)
    return "/" + "/".join(resolved)


@pytest.mark.parametrize(
    "room",
    [
        "post:/docs/../../rooms/group:7",
        "post:..",
        "post:a/./b",
        "post:x/..",
        "post:%2e%2e/%2E",
        "post:a\\..\\b",
        "post:q?after=x#y",
        "post:été/./",
    ],
)
def test_the_endpoint_a_browser_fetches_is_the_rooms(
    room: str, make_user: Callable[..., Any]
) -> None:
    # The room's JSON endpoint, fetched by presence.js as the browser resolves it, answers
    # that very room: its name is percent-encoded, "/" included (http.md, "Rooms").
    viewer = make_user()
    html = render("{% room_presence name %}", viewer, name=room)
    endpoint = re.search(r'data-presence-room-endpoint="([^"]*)"', html)
    assert endpoint is not None
    client = Client()
    client.force_login(viewer)
    response = client.get(fetched_path(unescape(endpoint.group(1))))
    assert response.status_code == 200
    assert response.json()["room"] == room


@pytest.mark.parametrize(
    "source",
    [
        '{% room_presence "group:3" %}',  # the rule refuses (odd id)
        '{% room_presence "broken:1" %}',  # the rule raises: refused
        '{% room_presence "lobby:1" %}',  # an undeclared kind
        '{% room_presence "post" %}',  # no id
        '{% room_presence "post:a b" %}',  # malformed
    ],
)
def test_a_room_the_viewer_may_not_see_renders_nothing(
    source: str, make_user: Callable[..., Any]
) -> None:
    ann, ben = make_user("ann"), make_user("ben")
    Contact.objects.create(owner=ann, contact=ben)
    enter(ann, "group:3")
    assert render(source, ben) == ""


def test_a_room_whose_rule_does_not_import_renders_nothing(
    make_user: Callable[..., Any], settings: Any
) -> None:
    settings.PRESENCE = {"ROOMS": WITH_A_MISSING_RULE}
    assert render('{% room_presence "missing:1" %}', make_user("ann")) == ""


def test_nothing_for_an_anonymous_visitor(make_user: Callable[..., Any]) -> None:
    enter(make_user("ann"), "post:1")
    assert render('{% room_presence "post:1" %}', AnonymousUser()) == ""


@pytest.mark.parametrize(
    ("language", "here"),
    [("ja", "現在ここに: "), ("zh-hans", "此刻在这里\uff1a"), ("vi", "Đang ở đây: ")],
)
def test_the_count_in_the_pages_language(
    language: str, here: str, make_user: Callable[..., Any]
) -> None:
    with translation.override(language):
        html = render('{% room_presence "post:1" %}', make_user())
    assert f'<span class="presence-room__count">{here}<span data-presence-room-count>0' in html
