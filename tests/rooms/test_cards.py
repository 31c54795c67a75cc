"""Member cards (issue 38, PRESENCE["MEMBER_CARD"]) on the read paths: ``{% room_presence %}``
(and its ``template_name``), the rooms' JSON, ``{% online_friends_list %}``, ``{% member_card %}``;
a card only for the members listed (never a hidden one's), each user's card once per read;
presence.E013 for a path that does not import or call. The live frames: test_card_sockets.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.template import Context, Template
from django.test import Client, RequestFactory

from presence import api, checks
from presence.models import Contact
from presence.rendering import dot_html
from presence.rooms.cards import cards_for_keys
from tests.privacy_cases import quiet_login
from tests.rooms import cards
from tests.rooms.members import enter
from tests.rooms.rules import ROOMS
from tests.rooms.test_rooms_tags import member_html, room_html
from tests.stamping import without_stamps

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]


@pytest.fixture(autouse=True)
def _rooms(settings: Any) -> Iterator[None]:
    settings.PRESENCE = {"ROOMS": ROOMS}
    cards.calls.clear()
    yield
    cards.calls.clear()


def with_card(settings: Any, path: str | None = cards.CUSTOM) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "MEMBER_CARD": path}


def render(source: str, viewer: Any, **context: Any) -> str:
    request = RequestFactory().get("/")
    request.user = viewer
    html = Template("{% load presence %}" + source).render(Context({"request": request, **context}))
    return without_stamps(html, viewer)


def avatar_member_html(user: Any, name: str, avatar: str, status: str = "online") -> str:
    label = {"online": "Online", "offline": "Offline"}[status]
    return (
        f'<li class="presence-room__member" data-presence-room-member="{user.pk}">'
        f'<img class="presence-room__avatar" src="{avatar}" alt="{name}">'
        f'<span class="presence-dot presence-dot--{status}" data-presence-user="{user.pk}" '
        f'title="{label}" aria-label="{label}" role="img"></span> '
        f'<span class="presence-room__name">{name}</span></li>'
    )


def a_room(make_user: Callable[..., Any]) -> tuple[Any, Any, Any]:
    """ann (Ann Smith) lets ben see her; cy lets nobody: both in post:42, ben looking."""
    ann = make_user("ann", first_name="Ann", last_name="Smith")
    ben, cy = make_user("ben"), make_user("cy")
    Contact.objects.create(owner=ann, contact=ben)
    enter(ann, "post:42")
    enter(cy, "post:42")
    return ann, ben, cy


# --- {% room_presence %} --------------------------------------------------------------------


def test_the_default_card_full_name_else_username_and_initials(
    make_user: Callable[..., Any],
) -> None:
    ann, ben, _ = a_room(make_user)
    enter(ben, "post:42")
    html = render('{% room_presence "post:42" %}', ben)
    members = member_html(ben, "BE", "ben") + member_html(ann, "AS", "Ann Smith")
    assert html == room_html("post:42", ben, members, others=1, count=3)


def test_a_custom_card_shows_its_avatar_and_name(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    with_card(settings)
    ann, ben, cy = a_room(make_user)
    html = render('{% room_presence "post:42" %}', ben)
    member = avatar_member_html(ann, "Ann Card", "/media/ann.png")
    expected = room_html("post:42", ben, member, others=1, count=2).replace(
        'data-presence-room-viewer-name="ben"', 'data-presence-room-viewer-name="Ben Card"'
    )
    assert html == expected
    # cy is hidden from ben: her card is never computed, let alone shown.
    assert cy.pk not in cards.calls and "Cy Card" not in html and "cy.png" not in html
    assert sorted(cards.calls, key=str) == sorted([ann.pk, ben.pk], key=str)


def test_a_card_with_no_avatar_shows_initials(settings: Any, make_user: Callable[..., Any]) -> None:
    with_card(settings, "tests.rooms.cards.odd")  # a card of the wrong shape: the default
    ann, ben, _ = a_room(make_user)
    html = render('{% room_presence "post:42" %}', ben)
    assert html == room_html("post:42", ben, member_html(ann, "AS", "Ann Smith"), others=1, count=2)


def test_a_card_function_that_raises_is_logged_and_the_default_shown(
    settings: Any, make_user: Callable[..., Any], caplog: Any
) -> None:
    with_card(settings, "tests.rooms.cards.raises")
    ann, ben, _ = a_room(make_user)
    html = render('{% room_presence "post:42" %}', ben)
    assert member_html(ann, "AS", "Ann Smith") in html
    assert "MEMBER_CARD raised" in caplog.text


def test_room_presence_takes_a_template_name(
    settings: Any, make_user: Callable[..., Any], tmp_path: Any
) -> None:
    with_card(settings)
    (tmp_path / "room.html").write_text(
        "{% for m in members %}{{ m.key }}={{ m.card.name }}|{{ m.card.avatar }}|"
        "{{ m.card.initials }}|{{ m.status }};{% endfor %}{{ count }}/{{ others }}"
    )
    settings.TEMPLATES = [
        {**settings.TEMPLATES[0], "DIRS": [str(tmp_path), *settings.TEMPLATES[0]["DIRS"]]}
    ]
    ann, ben, _ = a_room(make_user)
    html = render('{% room_presence "post:42" template_name="room.html" %}', ben)
    assert html == f"{ann.pk}=Ann Card|/media/ann.png|AC|online;2/1"


# --- the rooms' JSON --------------------------------------------------------------------------


def room_json(viewer: Any, room: str = "post:42") -> dict[str, Any]:
    client = Client()
    quiet_login(client, viewer)
    response = client.get(f"/presence/api/rooms/{room}")
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def test_the_json_carries_default_cards(make_user: Callable[..., Any]) -> None:
    ann, ben, _ = a_room(make_user)
    body = room_json(ben)
    assert body["members"] == {
        str(ann.pk): {
            "meta": None,
            "presence": body["members"][str(ann.pk)]["presence"],
            "name": "Ann Smith",
            "card": {"name": "Ann Smith", "avatar": None},
        }
    }
    assert (body["others"], body["count"]) == (1, 2)


def test_the_json_carries_custom_cards_of_listed_members_only(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    with_card(settings)
    ann, ben, cy = a_room(make_user)
    enter(ben, "post:42")
    body = room_json(ben)
    assert {key: member["card"] for key, member in body["members"].items()} == {
        str(ben.pk): {"name": "Ben Card", "avatar": "/media/ben.png"},
        str(ann.pk): {"name": "Ann Card", "avatar": "/media/ann.png"},
    }
    assert body["members"][str(ann.pk)]["name"] == "Ann Card"  # the name follows the card
    assert cy.pk not in cards.calls and "Cy" not in str(body)
    # One card per listed user for this read.
    assert sorted(cards.calls, key=str) == sorted([ann.pk, ben.pk], key=str)


def test_with_names_and_its_async_twin_name_the_listed_members_only(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    with_card(settings)
    ann, ben, cy = a_room(make_user)
    state = api.room_presence("post:42", ben)
    named = api.with_names(state)
    assert named == async_to_sync(api.awith_names)(state)
    assert {key: (m["name"], m["card"]) for key, m in named["members"].items()} == {
        str(ann.pk): ("Ann Card", {"name": "Ann Card", "avatar": "/media/ann.png"})
    }
    assert (named["count"], named["others"]) == (state["count"], state["others"])
    assert cy.pk not in cards.calls


# --- {% online_friends_list %} and {% member_card %} ------------------------------------------


def friends(viewer: Any, *others: Any) -> None:
    for other in others:
        Contact.objects.create(owner=viewer, contact=other)
        Contact.objects.create(owner=other, contact=viewer)
        api.touch(other)


def test_the_friends_list_shows_cards(
    settings: Any, make_user: Callable[..., Any], clock: Any
) -> None:
    ann, ben = make_user("ann"), make_user("ben", first_name="Ben", last_name="Ito")
    friends(ann, ben)
    default = render("{% online_friends_list %}", ann)
    dot = dot_html(ben.pk, api.get_presence(ben, ann).status)
    assert f">{dot} Ben Ito</li>" in default and "<img" not in default
    with_card(settings)
    custom = render("{% online_friends_list %}", ann)
    assert (
        default.replace(
            f">{dot} Ben Ito</li>",
            f'><img class="presence-friends__avatar" src="/media/ben.png" alt="Ben Card"> '
            f"{dot} Ben Card</li>",
        )
        == custom
    )


def test_member_card_tag_once_per_user_per_request(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    with_card(settings)
    ann = make_user("ann")
    source = (
        "{% member_card ann as a %}{% member_card ann as b %}{% member_card ann_id as c %}"
        "{{ a.name }}|{{ b.avatar }}|{{ c.initials }}|{% member_card 'nobody' as d %}{{ d }}"
    )
    html = render(source, ann, ann=ann, ann_id=ann.pk)
    assert html == "Ann Card|/media/ann.png|AC|None"
    assert cards.calls == [ann.pk]


# --- presence.E013 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("tests.rooms.cards.no_such_card", "does not import"),
        ("no.such.module.card", "does not import"),
        ("tests.rooms.cards.NOT_CALLABLE", "not a function"),
        (".card", "does not import"),
        ("tests.rooms.raises_on_import.card", "does not import"),
        (42, "not a dotted path"),
        ("", "not a dotted path"),
    ],
)
def test_e013_a_card_path_that_does_not_import_or_call(
    settings: Any, make_user: Callable[..., Any], path: Any, said: str
) -> None:
    settings.PRESENCE = {"MEMBER_CARD": path}
    (message,) = checks.check_settings()
    assert message.id == "presence.E013"
    assert said in message.msg and "MEMBER_CARD" in message.msg and message.hint
    # Meanwhile members are shown by their default cards.
    assert api.member_card(make_user("ann", first_name="Ann")) == {"name": "Ann", "avatar": None}


def test_a_good_card_path_passes(settings: Any) -> None:
    for path in (cards.CUSTOM, None):
        settings.PRESENCE = {"MEMBER_CARD": path}
        assert checks.check_settings() == []


# --- the default cards of many members, read at once (a room_state's, the rooms' JSON) ------


def test_the_default_cards_read_at_once_name_each_member_as_display_name_does(
    make_user: Callable[..., Any],
) -> None:
    users = [
        make_user("ann", first_name="Ann", last_name="Smith"),
        make_user("bo", first_name="Bo"),
        make_user("li", last_name="Li"),
        make_user("dee", first_name=" ", last_name=" "),
    ]
    keys = [str(user.pk) for user in users]
    found = cards_for_keys([*keys, "999999", "not-an-id"])
    assert found == {
        keys[0]: {"name": "Ann Smith", "avatar": None},
        keys[1]: {"name": "Bo", "avatar": None},
        keys[2]: {"name": "Li", "avatar": None},
        keys[3]: {"name": "dee", "avatar": None},
    }
    assert found == {str(user.pk): api.member_card(user) for user in users}


def test_a_user_models_own_full_name_names_its_cards(
    make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ann = make_user("ann", first_name="Ann", last_name="Smith")
    model = type(ann)
    monkeypatch.setattr(model, "get_full_name", lambda user: f"Dr {user.last_name}", raising=False)
    assert cards_for_keys([str(ann.pk)]) == {str(ann.pk): {"name": "Dr Smith", "avatar": None}}
    monkeypatch.setattr(model, "get_username", lambda user: "nobody", raising=False)
    monkeypatch.setattr(model, "get_full_name", lambda user: "", raising=False)
    assert cards_for_keys([str(ann.pk)]) == {str(ann.pk): {"name": "nobody", "avatar": None}}
