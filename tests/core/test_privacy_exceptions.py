"""Per-person exceptions ("always share with" / "never share with") and reciprocity, checked on
the read paths against a table of their own (never by calling the resolver), and what they cost
(the same queries and round trips as without them).

Rows of the rule in docs/privacy.md: 3 (never share), 4 (always share), 6 (invisible beats an
always share), 7 (reciprocity); rows 2 and 5 alongside (blocks, levels).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from presence import api, domain, lifecycle, relations
from presence.models import (
    Block,
    Contact,
    LastSeen,
    PrivacyException,
    PrivacySettings,
    UserStatus,
)
from presence.privacy import visible_to
from presence.store import get_store
from tests.privacy_cases import count_round_trips

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]

NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)
FIELDS = ("online_visibility", "last_seen_visibility", "activity_visibility")
#: who each level admits (besides the target): an independent copy of the contract's words
ADMITS = {"everyone": {"contact", "stranger"}, "contacts": {"contact"}, "nobody": set()}
EXCEPTIONS: tuple[tuple[str, bool] | None, ...] = (
    None,
    *((field, allow) for field in FIELDS for allow in (True, False)),
)


@dataclass(frozen=True)
class Case:
    level: str  # all three fields at this level
    relation: str  # contact, stranger or blocked (a contact the target blocked)
    exception: tuple[str, bool] | None  # the target's exception for the viewer
    invisible: bool

    @property
    def id(self) -> str:
        exception = "none"
        if self.exception:
            field, allow = self.exception
            exception = f"{'allow' if allow else 'deny'}-{field.split('_visibility')[0]}"
        return f"{self.level}-{self.relation}-{exception}-{'inv' if self.invisible else 'vis'}"


CASES = [
    Case(level, relation, exception, invisible)
    for level, relation, exception, invisible in itertools.product(
        ADMITS, ("contact", "stranger", "blocked"), EXCEPTIONS, (False, True)
    )
]


def expected(case: Case) -> dict[str, Any]:
    """From the contract: a block beats everything; an exception beats the level; invisible
    beats an allow; last seen needs online shown; hidden last seen shows the day's bucket."""

    def sees(field: str) -> bool:
        if case.relation == "blocked":
            return False
        if case.exception and case.exception[0] == field:
            return case.exception[1]
        return case.relation in ADMITS[case.level]

    online = not case.invisible and sees("online_visibility")
    last_seen = online and sees("last_seen_visibility")
    custom = sees("activity_visibility")
    return {
        "status": "online" if online else "offline",
        "last_seen": NOW.isoformat() if last_seen else None,
        "last_seen_approx": None if last_seen or case.relation == "blocked" else "recently",
        "devices": ["web"] if online else [],
        "text": "Lunch" if custom else None,
        "emoji": None,
        "activity": None,
    }


def build(case: Case, make_user: Callable[..., Any]) -> tuple[Any, Any]:
    target, viewer = make_user(), make_user()
    if case.relation in {"contact", "blocked"}:
        Contact.objects.create(owner=target, contact=viewer)
    if case.relation == "blocked":
        Block.objects.create(blocker=target, blocked=viewer)
    PrivacySettings.objects.create(
        user=target, invisible=case.invisible, **dict.fromkeys(FIELDS, case.level)
    )
    UserStatus.objects.create(user=target, text="Lunch")
    if case.exception:
        api.share_with(target, viewer, case.exception[0], allow=case.exception[1])
    # Active yesterday and today: the approximate last seen counts from yesterday (the last
    # day before today), "recently".
    with time_machine.travel(NOW - timedelta(days=1), tick=False):
        api.touch(target)
    api.touch(target)
    return target, viewer


@pytest.mark.privacy_matrix
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_exceptions_on_the_read_paths(case: Case, make_user: Callable[..., Any]) -> None:
    with time_machine.travel(NOW, tick=False):
        target, viewer = build(case, make_user)
        want = expected(case)
        assert api.get_presence(target, viewer).as_dict() == want
        assert api.bulk_presence([target], viewer)[target.pk].as_dict() == want

        async def fan_out() -> Any:
            try:
                return await lifecycle.apresence_for_viewers({target.pk: [viewer.pk]})
            finally:
                await get_store().aclose()

        # The live fan-out's facts (many viewers at once) decide the same.
        assert async_to_sync(fan_out)()[target.pk][viewer.pk].as_dict() == want


@dataclass(frozen=True)
class Mutual:
    """A pair where the target shows everything to the viewer unless reciprocity hides it."""

    own_level: str  # the viewer's own last_seen_visibility
    own_exception: bool | None  # the viewer's own last-seen exception for the target
    own_invisible: bool
    target_allows: bool  # the target's "always share last seen" with the viewer

    @property
    def viewer_hides(self) -> bool:
        """Whether the viewer's exact last seen is hidden from the target (the viewer's side,
        by the contract's words; the target is the viewer's contact)."""
        if self.own_invisible:
            return True
        if self.own_exception is not None:
            return not self.own_exception
        return self.own_level == "nobody"


MUTUAL = [
    Mutual(level, exception, invisible, allows)
    for level in ("everyone", "nobody")
    for exception in (None, True, False)
    for invisible in (False, True)
    for allows in (False, True)
]


@pytest.mark.privacy_matrix
@pytest.mark.parametrize("reciprocal", [False, True])
@pytest.mark.parametrize(
    "pair",
    MUTUAL,
    ids=[
        f"{m.own_level}-{m.own_exception}-{'inv' if m.own_invisible else 'vis'}-"
        f"{'allows' if m.target_allows else 'level'}"
        for m in MUTUAL
    ],
)
def test_reciprocity(
    pair: Mutual, reciprocal: bool, settings: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {**getattr(settings, "PRESENCE", {}), "RECIPROCAL_LAST_SEEN": reciprocal}
    with time_machine.travel(NOW, tick=False):
        target, viewer = make_user(), make_user()
        Contact.objects.create(owner=target, contact=viewer)
        Contact.objects.create(owner=viewer, contact=target)
        PrivacySettings.objects.create(
            user=viewer,
            online_visibility="everyone",
            last_seen_visibility=pair.own_level,
            invisible=pair.own_invisible,
        )
        if pair.own_exception is not None:
            api.share_with(viewer, target, "last_seen_visibility", pair.own_exception)
        if pair.target_allows:
            api.share_with(target, viewer, "last_seen_visibility")
        # Last seen yesterday as the database keeps it (presence_cleanup), today in Redis.
        LastSeen.objects.create(user=target, seen_at=NOW - timedelta(days=1))
        api.touch(target)
        api.touch(viewer)
        hidden = reciprocal and pair.viewer_hides  # it beats the target's "always share"
        seen = api.get_presence(target, viewer)
        assert seen.status is domain.Status.ONLINE  # reciprocity is about last seen only
        assert seen.last_seen == (None if hidden else NOW)
        assert seen.last_seen_approx == (domain.LastSeenApprox.RECENTLY if hidden else None)
        assert api.bulk_presence([target], viewer)[target.pk] == seen

        async def fan_out() -> Any:
            try:
                return await lifecycle.apresence_for_viewers({target.pk: [viewer.pk]})
            finally:
                await get_store().aclose()

        assert async_to_sync(fan_out)()[target.pk][viewer.pk] == seen
        # The target's view of the viewer is the viewer's own choice, reciprocity or not.
        back = api.get_presence(viewer, target)
        assert (back.last_seen is None) == pair.viewer_hides


def test_an_anonymous_viewer_has_no_exception_and_no_reciprocity(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {**getattr(settings, "PRESENCE", {}), "RECIPROCAL_LAST_SEEN": True}
    with time_machine.travel(NOW, tick=False):
        target = make_user()
        PrivacySettings.objects.create(user=target, **dict.fromkeys(FIELDS, "everyone"))
        api.touch(target)
        assert api.get_presence(target, None).last_seen == NOW


@pytest.mark.parametrize("reciprocal", [False, True])
def test_exceptions_cost_no_query_and_no_round_trip(
    reciprocal: bool, settings: Any, make_user: Callable[..., Any]
) -> None:
    """Exceptions (both directions) are read in the same one query as the other facts, on
    every read path; the fan-out stays three queries whatever the number of viewers."""
    settings.PRESENCE = {**getattr(settings, "PRESENCE", {}), "RECIPROCAL_LAST_SEEN": reciprocal}
    viewer = make_user()
    friends = [make_user() for _ in range(6)]
    for index, friend in enumerate(friends):
        Contact.objects.create(owner=friend, contact=viewer)
        Contact.objects.create(owner=viewer, contact=friend)
        if index % 2:
            api.share_with(friend, viewer, FIELDS[index % 3], allow=bool(index % 4))
            api.share_with(viewer, friend, "last_seen_visibility", allow=False)
        api.touch(friend)
    ids = [friend.pk for friend in friends]
    api.online_friends(viewer)  # warm: the connection, the scripts
    with CaptureQueriesContext(connection) as queries, count_round_trips() as trips:
        api.get_presence(friends[1], viewer)
    assert (len(queries), trips.count) == (1, 1)
    with CaptureQueriesContext(connection) as queries, count_round_trips() as trips:
        api.bulk_presence(ids, viewer)
    assert (len(queries), trips.count) == (1, 1)
    with CaptureQueriesContext(connection) as queries, count_round_trips() as trips:
        listed = api.online_friends(viewer)
    assert (len(queries), trips.count) == (2, 1)
    assert {friend.pk for friend in listed} <= set(ids)

    async def fan_out() -> Any:
        try:
            await get_store().async_client.ping()
            with count_round_trips() as trips:
                result = await lifecycle.apresence_for_viewers({pk: [viewer.pk] for pk in ids})
            assert trips.count == 1
            return result
        finally:
            await get_store().aclose()

    with CaptureQueriesContext(connection) as queries:
        resolved = async_to_sync(fan_out)()
    assert len(queries) == 3
    # ... and decides what the one-viewer path decides.
    assert {pk: seen[viewer.pk] for pk, seen in resolved.items()} == api.bulk_presence(ids, viewer)


def test_the_facts_of_the_fan_out_and_of_one_viewer_agree(
    settings: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {**getattr(settings, "PRESENCE", {}), "RECIPROCAL_LAST_SEEN": True}
    people = [make_user() for _ in range(5)]
    for owner, viewer in itertools.permutations(people, 2):
        if (people.index(owner) + people.index(viewer)) % 2:
            Contact.objects.create(owner=owner, contact=viewer)
        if (people.index(owner) * 3 + people.index(viewer)) % 4 == 1:
            api.share_with(
                owner, viewer, "last_seen_visibility", allow=people.index(owner) % 2 == 0
            )
    PrivacySettings.objects.create(user=people[0], last_seen_visibility="nobody")
    ids = [person.pk for person in people]
    pairs = relations.load_pairs(ids, ids)
    for viewer in people:
        facts = relations.load(viewer, ids)
        for target in people:
            assert pairs.relation(viewer.pk, target.pk) == facts[target.pk][0], (viewer, target)


def test_an_exception_is_unique_per_owner_viewer_and_setting(make_user: Callable[..., Any]) -> None:
    owner, viewer = make_user(), make_user()
    assert api.share_with(owner, viewer, "online_visibility") is True
    assert api.share_with(owner, viewer, "online_visibility") is False  # nothing changed
    assert api.share_with(owner, viewer, "online_visibility", allow=False) is True  # flipped
    row = PrivacyException.objects.get(owner=owner, viewer=viewer)
    assert (row.setting, row.allow) == ("online_visibility", False)
    assert api.unshare(owner, viewer, "online_visibility") is True
    assert api.unshare(owner, viewer, "online_visibility") is False
    assert not PrivacyException.objects.exists()


@pytest.mark.parametrize(
    ("setting", "allow", "same", "code", "words"),
    [
        ("last_seen", True, False, "invalid_value", "setting must be one of"),
        ("online_visibility", "yes", False, "invalid_value", "allow must be True or False"),
        ("online_visibility", True, True, "invalid_value", "cannot share with themselves"),
    ],
)
def test_bad_input_says_what_to_do_and_changes_nothing(
    setting: str, allow: Any, same: bool, code: str, words: str, make_user: Callable[..., Any]
) -> None:
    owner, viewer = make_user(), make_user()
    with pytest.raises(domain.InvalidInput) as raised:
        api.share_with(owner, owner if same else viewer, setting, allow)
    assert raised.value.code == code
    assert words in str(raised.value)
    assert not PrivacyException.objects.exists()


def test_an_unknown_user_is_refused(make_user: Callable[..., Any]) -> None:
    owner = make_user()
    with pytest.raises(domain.InvalidInput) as raised:
        api.share_with(owner, 987_654_321, "online_visibility")
    assert raised.value.code == "unknown_users"


def test_the_async_twins(make_user: Callable[..., Any]) -> None:
    owner, viewer = make_user(), make_user()
    assert async_to_sync(api.ashare_with)(owner, viewer, "activity_visibility", False) is True
    assert PrivacyException.objects.get().allow is False
    assert async_to_sync(api.aunshare)(owner, viewer, "activity_visibility") is True
    assert not PrivacyException.objects.exists()


@pytest.mark.parametrize("allow", [True, False])
def test_visible_to_follows_exceptions(allow: bool, make_user: Callable[..., Any]) -> None:
    """The privacy rule as a query (the feed's filter) applies exceptions as the resolver does."""
    owner, viewer, other = make_user(), make_user(), make_user()
    # contacts: the viewer is one, the other is not
    Contact.objects.create(owner=owner, contact=viewer)
    level = "contacts" if not allow else "nobody"
    PrivacySettings.objects.create(user=owner, activity_visibility=level)
    api.share_with(owner, viewer, "activity_visibility", allow=allow)
    model = type(owner)
    seen = set(model.objects.filter(visible_to(viewer, "pk")).values_list("pk", flat=True))
    assert (owner.pk in seen) is allow
    Block.objects.create(blocker=viewer, blocked=owner)  # a block beats an allow
    seen = set(model.objects.filter(visible_to(viewer, "pk")).values_list("pk", flat=True))
    assert owner.pk not in seen
    assert other.pk not in set(
        model.objects.filter(visible_to(viewer, "pk")).values_list("pk", flat=True)
    )


def test_online_friends_order_by_what_the_viewer_may_see(make_user: Callable[..., Any]) -> None:
    """A friend whose last seen is hidden from the viewer ("never share with") sorts as if
    unknown (after those shown, by id), never by the hidden time: the order tells nothing."""
    viewer = make_user()
    first, second, hidden = make_user(), make_user(), make_user()
    for friend in (first, second, hidden):
        Contact.objects.create(owner=friend, contact=viewer)
        Contact.objects.create(owner=viewer, contact=friend)
    api.share_with(hidden, viewer, "last_seen_visibility", allow=False)
    for ago, friend in ((30, second), (20, first), (0, hidden)):  # hidden: the most recent
        with time_machine.travel(NOW.timestamp() - ago, tick=False):
            api.touch(friend)
    with time_machine.travel(NOW, tick=False):
        assert api.online_friends(viewer) == [first, second, hidden]
        # The live list ({% online_friends_list %}) holds them in the same order.
        online, _ = api.watched_friends(viewer, 10)
        assert [friend for friend, _ in online] == [first, second, hidden]
        assert [seen.last_seen is None for _, seen in online] == [False, False, True]
        # Without the exception the most recent comes first (the test can fail).
        api.unshare(hidden, viewer, "last_seen_visibility")
        assert api.online_friends(viewer) == [hidden, first, second]
