"""PRESENCE["DEFAULT_PRIVACY"]: the levels of a user without a PrivacySettings row, applied by the
one resolver on every read path (Python API, template tags, JSON endpoint, DRF field, the live
fan-out's facts, the feed's visible_to), in the same queries as before; rows created without
explicit values start from it; presence.E010 reports a bad value.

The WebSocket's snapshot and diffs: tests/core/test_default_privacy_socket.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.template import Context, Template
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from presence import api, checks, domain, privacy, relations
from presence.conf import get_settings
from presence.models import Block, Contact, PrivacySettings, UserStatus, privacy_defaults
from tests.privacy_cases import FIELDS, NOW, RELATIONS, Case, build, expected, quiet_login

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]

PUBLIC = dict.fromkeys(FIELDS, "everyone")
#: last_seen_visibility left out: contacts
MIXED = {"online_visibility": "everyone", "activity_visibility": "close_friends"}
PRIVATE = dict.fromkeys(FIELDS, "nobody")
DEFAULTS = {"public": PUBLIC, "mixed": MIXED, "private": PRIVATE}


def levels_of(default: dict[str, str]) -> dict[str, str]:
    """What a user without a row has: the default's levels, "contacts" where it names none."""
    return {name: default.get(name, "contacts") for name in FIELDS}


#: a target without a PrivacySettings row (build() adds one with only ``invisible`` for an
#: invisible target: its levels are then the fields' defaults, the site default too)
NO_ROW_CASES = [
    Case(None, relation, invisible, online)
    for relation in RELATIONS
    for invisible in (False, True)
    for online in (True, False)
]


def _request(viewer: Any) -> Any:
    from django.contrib.auth.models import AnonymousUser

    request = RequestFactory().get("/")
    request.user = viewer if viewer is not None else AnonymousUser()
    return request


# --- the resolver, on every read path ------------------------------------------------------------


@pytest.mark.privacy_matrix
@pytest.mark.parametrize("default_name", list(DEFAULTS))
@pytest.mark.parametrize("case", NO_ROW_CASES, ids=[case.id for case in NO_ROW_CASES])
def test_a_user_without_a_row_has_the_site_default_on_every_read_path(
    case: Case, default_name: str, settings: Any, make_user: Callable[..., Any]
) -> None:
    """The privacy matrix of tests/privacy_cases.py for a target without privacy settings,
    expected as for a target whose row says the site's default levels (blocks and invisibility
    still win), through the API, its async twin, the template tags, the JSON endpoint and the
    DRF field."""
    from rest_framework import serializers

    from presence.drf import PresenceField

    default = DEFAULTS[default_name]
    settings.PRESENCE = {"DEFAULT_PRIVACY": default}
    want = expected(replace(case, visibility=levels_of(default)))
    with time_machine.travel(NOW, tick=False):
        scenario = build(case, make_user)
        target, viewer = scenario.target, scenario.viewer
        assert not PrivacySettings.objects.filter(user=target).exclude(**levels_of(default))

        assert api.get_presence(target, viewer).as_dict() == want.as_json()
        assert async_to_sync(api.aget_presence)(target, viewer).as_dict() == want.as_json()

        html = Template("{% load presence %}{% presence_dot target %}").render(
            Context({"request": _request(viewer), "target": target})
        )
        assert f"presence-dot--{want.status}" in html

        class UserSerializer(serializers.Serializer):  # type: ignore[type-arg]
            presence = PresenceField(source="*")

        field = UserSerializer(target, context={"request": _request(viewer)}).data["presence"]
        assert field == want.as_json()

        if viewer is not None:
            client = Client()
            quiet_login(client, viewer)
            response = client.get(reverse("presence:presence"), {"users": str(target.pk)})
            assert response.status_code == 200
            assert response.json() == {"presences": {str(target.pk): want.as_json()}}


def test_a_stranger_sees_a_public_default_but_not_a_row_that_says_contacts(
    settings: Any, clock: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": PUBLIC}
    stranger, no_row, contacts_row = make_user(), make_user(), make_user()
    PrivacySettings.objects.create(user=contacts_row, **dict.fromkeys(FIELDS, "contacts"))
    for user in (no_row, contacts_row):
        UserStatus.objects.create(user=user, text="Reading")
        api.touch(user)
    seen = api.bulk_presence([no_row, contacts_row], stranger)
    assert seen[no_row.pk].status is domain.Status.ONLINE
    assert seen[no_row.pk].last_seen is not None and seen[no_row.pk].text == "Reading"
    # Nothing: not even the day, none before today being known (APPROXIMATE_LAST_SEEN).
    assert seen[contacts_row.pk] == domain.Presence()
    # Anonymous viewers too (a public site's visitors).
    assert api.get_presence(no_row, None).is_online
    assert not api.get_presence(contacts_row, None).is_online


@pytest.mark.parametrize("direction", ["target blocks", "viewer blocks"])
def test_a_block_still_wins_over_a_public_default(
    direction: str, settings: Any, clock: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": PUBLIC}
    viewer, target = make_user(), make_user()
    api.touch(target)
    assert api.get_presence(target, viewer).is_online
    if direction == "target blocks":
        Block.objects.create(blocker=target, blocked=viewer)
    else:
        Block.objects.create(blocker=viewer, blocked=target)
    assert api.get_presence(target, viewer) == domain.HIDDEN


def test_invisible_still_wins_over_a_public_default(
    settings: Any, clock: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": PUBLIC}
    viewer, target = make_user(), make_user()
    api.touch(target)
    api.set_status(target, "invisible")
    # Offline, and not even the day: none before today is known (APPROXIMATE_LAST_SEEN).
    recently = domain.Presence()
    assert api.get_presence(target, viewer) == recently
    # Going invisible made the row, from the site's default: back to auto, still public.
    row = PrivacySettings.objects.get(user=target)
    assert [getattr(row, name) for name in FIELDS] == ["everyone"] * 3
    api.set_status(target, "auto")
    assert api.get_presence(target, viewer).is_online


def test_a_default_of_nobody_hides_a_user_without_a_row_from_friends_too(
    settings: Any, clock: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": {"online_visibility": "nobody"}}
    user, friend = make_user(), make_user()
    Contact.objects.create(owner=user, contact=friend)
    Contact.objects.create(owner=friend, contact=user)
    api.touch(friend)
    assert not api.get_presence(friend, user).is_online
    assert api.online_friends(user) == []
    # The friend's own choice still counts.
    PrivacySettings.objects.create(user=friend, online_visibility="contacts")
    assert api.online_friends(user) == [friend]


# --- the same queries as before ------------------------------------------------------------------


def test_the_default_is_applied_in_the_same_queries(
    settings: Any, clock: Any, make_user: Callable[..., Any]
) -> None:
    """relations.load: one query; bulk_presence: one query; online_friends: two (the counts
    the tests of relations and the API hold without a default)."""
    settings.PRESENCE = {"DEFAULT_PRIVACY": PUBLIC}
    viewer = make_user()
    people = [make_user() for _ in range(5)]
    PrivacySettings.objects.create(user=people[0], online_visibility="contacts")
    for person in people:
        Contact.objects.create(owner=person, contact=viewer)
        Contact.objects.create(owner=viewer, contact=person)
        api.touch(person)
    strangers = [make_user() for _ in range(3)]
    for stranger in strangers:
        api.touch(stranger)
    get_settings(), privacy_defaults()  # read once, as any process does before its first read
    ids = [p.pk for p in people + strangers]
    with CaptureQueriesContext(connection) as queries:
        facts = relations.load(viewer, ids)
    assert len(queries) == 1
    assert facts[strangers[0].pk][1].online_visibility is domain.Visibility.EVERYONE
    assert facts[people[0].pk][1].online_visibility is domain.Visibility.CONTACTS
    with CaptureQueriesContext(connection) as queries:
        seen = api.bulk_presence(ids, strangers[0])
    assert len(queries) == 1
    assert sorted(pk for pk, p in seen.items() if p.is_online) == sorted(
        [p.pk for p in people[1:]] + [s.pk for s in strangers]
    )
    with CaptureQueriesContext(connection) as queries:
        friends = api.online_friends(viewer)
    assert len(queries) == 2
    assert {f.pk for f in friends} == {p.pk for p in people}
    # The live fan-out's facts: three queries whatever the number of viewers.
    with CaptureQueriesContext(connection) as queries:
        pairs = relations.load_pairs([viewer.pk, strangers[0].pk], ids)
    assert len(queries) == 3
    assert pairs.choices[strangers[1].pk].last_seen_visibility is domain.Visibility.EVERYONE


# --- visible_to: the rule as a queryset filter, and the feed -------------------------------------


@pytest.mark.parametrize("default_name", list(DEFAULTS))
@pytest.mark.parametrize("setting", privacy.SETTINGS)
def test_visible_to_honours_the_default(
    setting: str, default_name: str, settings: Any, make_user: Callable[..., Any]
) -> None:
    default = DEFAULTS[default_name]
    settings.PRESENCE = {"DEFAULT_PRIVACY": default}
    level = domain.Visibility(levels_of(default)[setting])
    viewer = make_user()
    stranger, contact, close, blocked = (make_user() for _ in range(4))
    Contact.objects.create(owner=contact, contact=viewer)
    Contact.objects.create(owner=close, contact=viewer, close_friend=True)
    Contact.objects.create(owner=blocked, contact=viewer, close_friend=True)
    Block.objects.create(blocker=blocked, blocked=viewer)
    ruled = make_user()  # a row of its own, the other level: the row wins
    other = "contacts" if level is domain.Visibility.EVERYONE else "everyone"
    PrivacySettings.objects.create(user=ruled, **{setting: other})
    relations_ = {
        stranger: domain.STRANGER,
        contact: domain.Relation(is_contact=True),
        close: domain.Relation(is_contact=True, is_close_friend=True),
        blocked: domain.Relation(is_contact=True, is_close_friend=True, blocked=True),
    }
    want = {viewer.pk} | {u.pk for u, rel in relations_.items() if domain.permits(level, rel)}
    if domain.permits(domain.Visibility(other), domain.STRANGER):
        want.add(ruled.pk)
    users = get_user_model().objects
    with CaptureQueriesContext(connection) as queries:
        kept = set(
            users.filter(privacy.visible_to(viewer, "pk", setting)).values_list("pk", flat=True)
        )
    assert len(queries) == 1
    assert kept == want
    # And what the resolver decides for each (the one rule).
    facts = relations.load(viewer, list(users.values_list("pk", flat=True)))
    assert kept == {
        pk for pk, (rel, choices) in facts.items() if domain.permits(getattr(choices, setting), rel)
    }


def test_the_feed_shows_activities_by_the_default(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    from presence.feed import api as feed
    from presence.feed.models import Activity

    settings.PRESENCE = {"DEFAULT_PRIVACY": {"activity_visibility": "everyone"}}
    viewer, no_row, contacts_row, blocker = (make_user() for _ in range(4))
    PrivacySettings.objects.create(user=contacts_row, activity_visibility="contacts")
    Block.objects.create(blocker=blocker, blocked=viewer)
    posts = {
        author.pk: feed.post(author, f"hello from {author.pk}")
        for author in (no_row, contacts_row, blocker)
    }
    shown = set(
        Activity.objects.filter(feed.visible_to(viewer)).values_list("author_id", flat=True)
    )
    assert shown == {no_row.pk}
    assert [feed.can_see(viewer, a) for a in posts.values()] == [True, False, False]
    anonymous = set(
        Activity.objects.filter(feed.visible_to(None)).values_list("author_id", flat=True)
    )
    assert anonymous == {no_row.pk, blocker.pk}
    assert feed.user_timeline(no_row, viewer).activities
    assert not feed.user_timeline(contacts_row, viewer).activities


# --- rows created later start from the default ---------------------------------------------------


def test_a_row_created_without_values_starts_from_the_default(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    user, other, explicit = make_user(), make_user(), make_user()
    settings.PRESENCE = {"DEFAULT_PRIVACY": MIXED}
    row = PrivacySettings.objects.create(user=user)
    assert (row.online_visibility, row.last_seen_visibility, row.activity_visibility) == (
        "everyone",
        "contacts",
        "close_friends",
    )
    # An unsaved instance (a settings form's) shows the default as well; explicit values stay.
    assert PrivacySettings(user=other).online_visibility == "everyone"
    kept = PrivacySettings.objects.create(user=explicit, online_visibility="nobody")
    assert kept.online_visibility == "nobody" and kept.activity_visibility == "close_friends"
    # The default follows the setting; saved rows do not.
    settings.PRESENCE = {}
    assert PrivacySettings(user=other).online_visibility == "contacts"
    row.refresh_from_db()
    assert row.online_visibility == "everyone"


def test_the_models_defaults_are_functions_no_migration_bakes_in(settings: Any) -> None:
    """The fields' defaults name functions (serialised by reference), so a site's setting never
    ends up in a migration, and changing it needs none."""
    for name in FIELDS:
        default = PrivacySettings._meta.get_field(name).default
        assert callable(default) and default.__module__ == "presence.models"
    settings.PRESENCE = {"DEFAULT_PRIVACY": PUBLIC}
    call_command("makemigrations", "presence", check=True, dry_run=True, verbosity=0)


# --- the setting: typed, cached, checked ---------------------------------------------------------


def test_the_setting_is_a_read_only_mapping_cleared_on_change(settings: Any) -> None:
    assert get_settings().DEFAULT_PRIVACY == {}
    assert privacy_defaults() == domain.Choices()
    given = {"online_visibility": "everyone"}
    settings.PRESENCE = {"DEFAULT_PRIVACY": given}
    conf = get_settings()
    assert dict(conf.DEFAULT_PRIVACY) == given
    given["online_visibility"] = "nobody"  # a copy: the cached settings do not move
    assert conf.DEFAULT_PRIVACY == {"online_visibility": "everyone"}
    with pytest.raises(TypeError):
        conf.DEFAULT_PRIVACY["online_visibility"] = "nobody"  # type: ignore[index]
    assert privacy_defaults().online_visibility is domain.Visibility.EVERYONE
    assert privacy_defaults().last_seen_visibility is domain.Visibility.CONTACTS
    settings.PRESENCE = {"DEFAULT_PRIVACY": {"online_visibility": "nobody"}}
    assert privacy_defaults().online_visibility is domain.Visibility.NOBODY


@pytest.mark.parametrize(
    "bad",
    [
        "everyone",
        ["online_visibility", "everyone"],
        {"online": "everyone"},
        {"invisible": True},
        {"online_visibility": "public"},
        {"last_seen_visibility": None},
        {"activity_visibility": ["everyone"]},
    ],
)
def test_e010_default_privacy_must_map_settings_to_levels(bad: Any, settings: Any) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": bad}
    (message,) = checks.check_settings()
    assert message.id == "presence.E010"
    assert "DEFAULT_PRIVACY" in message.msg and "online_visibility" in message.hint
    assert "everyone" in message.hint
    # Reported by `manage.py check`; meanwhile presence runs on contacts where no level is valid.
    assert "presence.E010" in {m.id for m in run_checks()}
    assert privacy_defaults() == domain.Choices()


@pytest.mark.parametrize("good", [{}, PUBLIC, MIXED, PRIVATE, {"activity_visibility": "nobody"}])
def test_e010_absent_for_levels_of_settings(good: dict[str, str], settings: Any) -> None:
    settings.PRESENCE = {"DEFAULT_PRIVACY": good}
    assert checks.check_settings() == []
