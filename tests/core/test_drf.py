"""presence.drf.PresenceField: a user's presence in a Django REST framework serializer, as the
request's user may see it, a whole page at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from rest_framework import serializers

from presence import api
from presence.drf import PresenceField
from presence.feed import api as feed
from presence.feed.models import Activity
from presence.models import Contact
from tests.ids import wire_id
from tests.privacy_cases import count_round_trips

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]


class UserSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    presence = PresenceField(source="*")

    class Meta:
        model = get_user_model()
        fields = ["id", "presence"]


class ActivitySerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    author_presence = PresenceField(source="author_id")

    class Meta:
        model = Activity
        fields = ["id", "author_presence"]


class PostSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    author = UserSerializer()

    class Meta:
        model = Activity
        fields = ["id", "author"]


class ContactSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    presence = PresenceField(source="contact_id")

    class Meta:
        model = Contact
        fields = ["id", "presence"]


class GroupOfPeopleSerializer(serializers.Serializer):  # type: ignore[type-arg]
    people = UserSerializer(many=True)


def _request(user: Any) -> Any:
    request = RequestFactory().get("/api/people")
    request.user = user
    return request


def test_a_page_of_users_costs_one_query_and_one_round_trip(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer = make_user("viewer")
    people = [make_user(f"p{n}") for n in range(30)]
    for person in people[:10]:  # ten let the viewer see them, all are online
        Contact.objects.create(owner=person, contact=viewer)
    for person in people:
        api.touch(person)
    page = list(get_user_model().objects.filter(pk__in=[p.pk for p in people]).order_by("pk"))
    serializer = UserSerializer(page, many=True, context={"request": _request(viewer)})
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        data = serializer.data
    assert len(queries) == 1
    assert len(trips.commands) == 1
    statuses = {row["id"]: row["presence"]["status"] for row in data}
    assert statuses == {wire_id(p): "online" if p in people[:10] else "offline" for p in people}


def test_the_presence_is_what_the_viewer_may_see(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ann, contact, stranger = make_user("ann"), make_user("contact"), make_user("stranger")
    Contact.objects.create(owner=ann, contact=contact)
    api.touch(ann)
    seen_by = {
        viewer.username: UserSerializer(ann, context={"request": _request(viewer)}).data
        for viewer in (contact, stranger)
    }
    assert seen_by["contact"]["presence"]["status"] == "online"
    assert seen_by["stranger"]["presence"] == {
        "status": "offline",
        "last_seen": None,
        "last_seen_approx": None,  # seen today only: no day before today to count from
        "devices": [],
        "text": None,
        "emoji": None,
        "activity": None,
    }
    # No request in the context: a stranger's view.
    assert UserSerializer(ann).data["presence"]["status"] == "offline"


def test_a_user_id_source_reads_no_user_row(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, author = make_user("viewer"), make_user("author")
    Contact.objects.create(owner=author, contact=viewer)
    api.touch(author)
    posts = [feed.post(author, f"post {n}") for n in range(5)]
    rows = list(Activity.objects.filter(pk__in=[p.pk for p in posts]))
    serializer = ActivitySerializer(rows, many=True, context={"request": _request(viewer)})
    with CaptureQueriesContext(connection) as queries:
        data = serializer.data
    assert len(queries) == 1  # the privacy facts; the authors' rows are never loaded
    assert {row["author_presence"]["status"] for row in data} == {"online"}


@pytest.mark.parametrize("with_request", [True, False], ids=["request", "no request"])
def test_nested_and_requestless_pages_cost_one_read_too(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, with_request: bool
) -> None:
    viewer = make_user("viewer")
    authors = [make_user(f"a{n}") for n in range(5)]
    for author in authors:
        Contact.objects.create(owner=author, contact=viewer)
        api.touch(author)
    posts = [feed.post(author, "hi") for author in authors]
    rows = list(Activity.objects.filter(pk__in=[p.pk for p in posts]).select_related("author"))
    context = {"request": _request(viewer)} if with_request else {}
    with count_round_trips() as trips:
        data = PostSerializer(rows, many=True, context=context).data
    assert len(trips.commands) == 1
    # what each viewer may see: the contact sees them online, no request is a stranger
    want = "online" if with_request else "offline"
    assert [row["author"]["presence"]["status"] for row in data] == [want] * 5


def test_a_related_manager_and_a_nested_list_are_read_at_once(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, owner = make_user("viewer"), make_user("owner")
    people = [make_user(f"p{n}") for n in range(4)]
    for person in people:
        Contact.objects.create(owner=owner, contact=person)
        Contact.objects.create(owner=person, contact=viewer)
        api.touch(person)
    followed = get_user_model().objects.filter(pk__in=[p.pk for p in people]).order_by("pk")
    with count_round_trips() as trips:
        data = ContactSerializer(
            owner.presence_contacts, many=True, context={"request": _request(viewer)}
        ).data
    assert len(trips.commands) == 1
    assert [row["presence"]["status"] for row in data] == ["online"] * 4
    with count_round_trips() as trips:
        nested = GroupOfPeopleSerializer(
            {"people": followed}, context={"request": _request(viewer)}
        ).data
    assert len(trips.commands) == 1
    assert [row["presence"]["status"] for row in nested["people"]] == ["online"] * 4
