"""presence.feed: posting, mentions, the four timelines, privacy, paging, groups, status activities.

Expected timelines are recomputed by brute force (tests.feed_cases.World) from the rows in the
database, with privacy from an independent table, never by calling the feed's own filter.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from presence import api
from presence.domain import InvalidInput
from presence.feed import api as feed
from presence.feed.models import Activity, ActivityKind, Group, Membership, Mention
from presence.models import Block, Contact, PrivacySettings
from tests.clock import T0, at
from tests.feed_cases import (
    FEED_CASE_IDS,
    FEED_CASES,
    World,
    admitted,
    build_case,
    page_through,
)
from tests.ids import wire_id

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]

User = get_user_model()


def ids(page: feed.Page) -> list[int]:
    return [activity.pk for activity in page.activities]


def everyone_sees(*users: Any) -> None:
    for user in users:
        PrivacySettings.objects.update_or_create(
            user=user, defaults={"activity_visibility": "everyone"}
        )


# --- posting and mentions -------------------------------------------------------------------


def test_post_saves_the_activity_and_its_mentions(
    make_user: Callable[..., Any], clock: Any
) -> None:
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    activity = feed.post(alice, "  Lunch with @bob and @carol?  ")
    activity.refresh_from_db()
    assert (activity.author, activity.text, activity.kind) == (
        alice,
        "Lunch with @bob and @carol?",
        "post",
    )
    assert activity.created_at == T0
    mentions = Mention.objects.filter(activity=activity).order_by("user__username")
    assert [(m.user, m.created_at) for m in mentions] == [(bob, T0), (carol, T0)]


@pytest.mark.parametrize(
    ("text", "mentioned"),
    [
        ("@bob, @carol! (@dave)", ["bob", "carol", "dave"]),
        ("thanks @bob. And @dave's idea; @carol: yes?", ["bob", "dave", "carol"]),
        ("@nobody and @bobby and @bo", []),  # unknown names stay text
        ("write to carol@bob.com or bob@example.org", []),  # e-mail addresses
        ("@bob @bob @BOB @Bob", ["bob"]),  # repeated, any case: stored once
        ("@CAROL", ["carol"]),  # no exact match: case-insensitive
        ("@john.doe. and @john.doee", ["john.doe", "john"]),  # longest known name wins
        ("@Dave vs @dave", ["Dave", "dave"]),  # exact matches win over case
        ("@DAVE", []),  # matches Dave and dave ignoring case: ambiguous, left as text
        ("https://x.social/@bob", []),
        ("https://x.social/#@bob and ?a=1&@carol", []),  # in a URL
        ("@@bob @", []),
        ("@émile, @ÉMILE", ["Émile"]),  # any letter's case, on every database
        ("@οδυσσευς", ["Οδυσσευς"]),
    ],
)
def test_mention_parsing_with_real_users(
    text: str, mentioned: list[str], make_user: Callable[..., Any]
) -> None:
    for name in ("bob", "carol", "dave", "Dave", "john", "john.doe", "Émile", "Οδυσσευς"):
        make_user(name)
    author = make_user("author")
    activity = feed.post(author, text)
    stored = list(
        Mention.objects.filter(activity=activity).values_list("user__username", flat=True)
    )
    assert sorted(stored) == sorted(mentioned)
    assert [m.user.username for m in feed.mentions_of(activity)] == mentioned


def test_a_mention_after_long_runs_of_dots_is_still_found(make_user: Callable[..., Any]) -> None:
    # Two runs of 150 characters make more names than a post looks up (MAX_MENTION_NAMES).
    make_user("bob")
    author = make_user("author")
    activity = feed.post(author, f"@{'a.' * 70} @{'b.' * 70} hi @bob")
    assert [m.user.username for m in feed.mentions_of(activity)] == ["bob"]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "invalid_value"),
        ("   \n\t ", "invalid_value"),
        ("x" * 501, "invalid_value"),
        ("bad\x00byte @bob", "invalid_value"),
        (None, "invalid_message"),
        (["@bob"], "invalid_message"),
    ],
)
def test_bad_posts_save_nothing(text: Any, code: str, make_user: Callable[..., Any]) -> None:
    author, _ = make_user(), make_user("bob")
    with pytest.raises(InvalidInput) as raised:
        feed.post(author, text)
    assert raised.value.code == code
    assert not Activity.objects.exists() and not Mention.objects.exists()


def test_the_length_limit_is_a_setting(make_user: Callable[..., Any], settings: Any) -> None:
    author = make_user()
    assert len(feed.post(author, "x" * 500).text) == 500
    settings.PRESENCE_FEED = {"ACTIVITY_MAX_LENGTH": 10}
    feed.post(author, "ten chars!")
    with pytest.raises(InvalidInput, match="11 characters long; at most 10"):
        feed.post(author, "eleven char")
    assert Activity.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_failure_at_commit_leaves_nothing_half_saved(make_user: Callable[..., Any]) -> None:
    # The author does not exist: the foreign key fails when the transaction commits, after the
    # activity and its mention were written. Both must be gone.
    bob = make_user("bob")
    with pytest.raises(IntegrityError):
        feed.post(987_654_321, "hi @bob")
    assert not Activity.objects.exists()
    assert not Mention.objects.exists()
    assert User.objects.filter(pk=bob.pk).exists()


def test_activity_posted_is_sent_after_commit(
    make_user: Callable[..., Any], django_capture_on_commit_callbacks: Any
) -> None:
    received: list[Any] = []

    def listener(sender: Any, activity: Activity, **kwargs: Any) -> None:
        received.append(activity)

    feed.activity_posted.connect(listener)
    try:
        author = make_user()
        with django_capture_on_commit_callbacks(execute=False) as pending:
            activity = feed.post(author, "hello")
        assert received == []  # not before commit
        for callback in pending:
            callback()
        assert received == [activity]
        assert received[0].author == author
        with django_capture_on_commit_callbacks(execute=True), pytest.raises(InvalidInput):
            feed.post(author, "")
        assert received == [activity]
    finally:
        feed.activity_posted.disconnect(listener)


def test_anonymous_cannot_post() -> None:
    with pytest.raises(TypeError):
        feed.post(AnonymousUser(), "hello")


# --- the privacy matrix on every timeline ---------------------------------------------------


@pytest.mark.privacy_matrix
@pytest.mark.parametrize(("level", "relation"), FEED_CASES, ids=FEED_CASE_IDS)
def test_privacy_on_every_timeline(
    level: str | None, relation: str, make_user: Callable[..., Any]
) -> None:
    scenario = build_case(level, relation, make_user)
    author, viewer, activity = scenario.author, scenario.viewer, scenario.activity
    want = [activity.pk] if admitted(level, relation) else []

    assert feed.can_see(viewer, activity) is bool(want), "can_see"
    assert ids(feed.user_timeline(author, viewer)) == want, "user"
    assert ids(feed.group_timeline(scenario.group, viewer)) == want, "group"
    visible = Activity.objects.filter(feed.visible_to(viewer))
    assert list(visible.values_list("pk", flat=True)) == want, "visible_to"
    if viewer is None:
        assert ids(feed.following_timeline(viewer)) == []
        assert ids(feed.mentions_timeline(viewer)) == []
        return
    following = feed.following_timeline(viewer, include_self=relation == "self")
    assert ids(following) == want, "following"
    assert ids(feed.mentions_timeline(viewer)) == want, "mentions"


def test_privacy_is_read_at_each_page_load(make_user: Callable[..., Any]) -> None:
    author, viewer = make_user(), make_user()
    Contact.objects.create(owner=viewer, contact=author)
    old = feed.post(author, f"old @{viewer.username}")
    assert ids(feed.following_timeline(viewer)) == []  # default: contacts only
    Contact.objects.create(owner=author, contact=viewer)
    assert ids(feed.following_timeline(viewer)) == [old.pk]
    block = Block.objects.create(blocker=author, blocked=viewer)
    assert ids(feed.following_timeline(viewer)) == []
    assert ids(feed.mentions_timeline(viewer)) == []
    block.delete()
    PrivacySettings.objects.create(user=author, activity_visibility="nobody")
    assert ids(feed.following_timeline(viewer)) == []
    assert ids(feed.user_timeline(author, author)) == [old.pk]  # the author always sees


# --- timelines under follow / unfollow / join / leave ---------------------------------------


def test_follow_and_unfollow_change_all_past_activities_on_the_next_page(
    make_user: Callable[..., Any], clock: Any
) -> None:
    viewer, bob, carol = make_user(), make_user(), make_user()
    everyone_sees(bob, carol)
    posted = []
    for n in range(6):
        posted.append(feed.post(bob if n % 2 else carol, f"post {n}"))
        clock.shift(60)
    bobs = [a.pk for a in reversed(posted) if a.author == bob]
    carols = [a.pk for a in reversed(posted) if a.author == carol]
    assert ids(feed.following_timeline(viewer)) == []

    Contact.objects.create(owner=viewer, contact=bob)
    assert ids(feed.following_timeline(viewer)) == bobs

    # Mid-paging: page 1 (limit 2) before following carol, page 2 after.
    page1 = feed.following_timeline(viewer, limit=2)
    assert ids(page1) == bobs[:2]
    Contact.objects.create(owner=viewer, contact=carol)
    page2 = feed.following_timeline(viewer, limit=2, cursor=page1.next_cursor)
    below = [pk for pk in [a.pk for a in reversed(posted)] if pk < bobs[1]]
    assert ids(page2) == below[:2]

    Contact.objects.filter(owner=viewer, contact=bob).delete()
    assert ids(feed.following_timeline(viewer)) == carols
    page3 = feed.following_timeline(viewer, limit=2, cursor=page2.next_cursor)
    assert all(Activity.objects.get(pk=pk).author == carol for pk in ids(page3))


def test_join_and_leave_change_the_group_timeline_on_the_next_page(
    make_user: Callable[..., Any], clock: Any
) -> None:
    viewer, bob, carol = make_user(), make_user(), make_user()
    everyone_sees(bob, carol)
    group = Group.objects.create(name="Climbers", slug="climbers")
    old_bob = feed.post(bob, "before joining")
    clock.shift(10)
    old_carol = feed.post(carol, "carol too")
    assert ids(feed.group_timeline(group, viewer)) == []

    assert feed.join(bob, group) is True
    assert feed.join(bob, group) is False
    assert ids(feed.group_timeline(group, viewer)) == [old_bob.pk]
    assert feed.is_member(bob, group) and not feed.is_member(viewer, group)

    feed.join(carol, group)
    assert ids(feed.group_timeline(group, viewer)) == [old_carol.pk, old_bob.pk]
    assert feed.leave(bob, group) is True
    assert feed.leave(bob, group) is False
    assert ids(feed.group_timeline(group, viewer)) == [old_carol.pk]
    # The viewer need not be a member to read a group.
    assert ids(feed.group_timeline(group, None)) == [old_carol.pk]


def test_include_self_merges_own_activities(make_user: Callable[..., Any], clock: Any) -> None:
    viewer, bob = make_user(), make_user()
    everyone_sees(bob)
    Contact.objects.create(owner=viewer, contact=bob)
    posted = []
    for n in range(5):
        posted.append(feed.post(viewer if n % 2 else bob, f"{n}"))
        clock.shift(1)
    newest_first = [a.pk for a in reversed(posted)]
    assert ids(feed.following_timeline(viewer)) == [
        pk for pk in newest_first if Activity.objects.get(pk=pk).author == bob
    ]
    assert (
        page_through(
            lambda c: feed.following_timeline(viewer, cursor=c, limit=2, include_self=True), 2
        )
        == newest_first
    )


def test_mentions_timeline(make_user: Callable[..., Any], clock: Any) -> None:
    viewer, bob, carol = make_user("viewer"), make_user("bob"), make_user("carol")
    everyone_sees(bob, carol)
    first = feed.post(bob, "hi @viewer")
    clock.shift(5)
    feed.post(carol, "no mention of viewer here, @bob")
    clock.shift(5)
    second = feed.post(carol, "@Viewer @viewer again")
    assert ids(feed.mentions_timeline(viewer)) == [second.pk, first.pk]
    assert ids(feed.mentions_timeline(bob)) == [Activity.objects.get(text__contains="@bob").pk]
    Block.objects.create(blocker=viewer, blocked=carol)
    assert ids(feed.mentions_timeline(viewer)) == [first.pk]


def test_users_may_be_given_as_ids(make_user: Callable[..., Any]) -> None:
    viewer, bob = make_user("viewer"), make_user("bob")
    everyone_sees(bob)
    Contact.objects.create(owner=viewer, contact=bob)
    group = Group.objects.create(name="G", slug="g")
    assert feed.join(bob.pk, group) and feed.is_member(bob.pk, group)
    activity = feed.post(bob.pk, "hi @viewer")
    assert activity.author == bob
    want = [activity.pk]
    assert ids(feed.user_timeline(bob.pk, viewer.pk)) == want
    assert ids(feed.following_timeline(viewer.pk)) == want
    assert ids(feed.group_timeline(group, viewer.pk)) == want
    assert ids(feed.mentions_timeline(viewer.pk)) == want
    assert feed.can_see(viewer.pk, activity)
    assert feed.leave(bob.pk, group)


# --- paging ---------------------------------------------------------------------------------


def test_pages_are_newest_first_and_ties_break_by_id(
    make_user: Callable[..., Any], clock: Any
) -> None:
    author = make_user()
    everyone_sees(author)
    same_time = [feed.post(author, f"tie {n}").pk for n in range(7)]  # the clock stands still
    clock.shift(1)
    newer = feed.post(author, "newer").pk
    expected = [newer, *reversed(same_time)]
    for limit in (1, 2, 3, 8, 50):

        def fetch(cursor: str | None, limit: int = limit) -> feed.Page:
            return feed.user_timeline(author, None, cursor=cursor, limit=limit)

        assert page_through(fetch, limit) == expected
    page = feed.user_timeline(author, None, limit=8)
    assert page.next_cursor is None and len(page) == 8


@pytest.mark.parametrize("timeline", ["user", "following", "group", "mentions"])
def test_paging_while_activities_arrive_has_no_duplicates_or_gaps(
    timeline: str, make_user: Callable[..., Any], clock: Any
) -> None:
    viewer, bob, carol = make_user("viewer"), make_user("bob"), make_user("carol")
    everyone_sees(bob, carol)
    Contact.objects.create(owner=viewer, contact=bob)
    Contact.objects.create(owner=viewer, contact=carol)
    group = Group.objects.create(name="G", slug="g")
    feed.join(bob, group)
    feed.join(carol, group)

    def add(n: int) -> int:
        clock.shift(1 if n % 3 else 0)  # some ties
        return feed.post(bob if timeline == "user" or n % 2 else carol, f"{n} @viewer").pk

    fetch: dict[str, Callable[[str | None], feed.Page]] = {
        "user": lambda c: feed.user_timeline(bob, viewer, cursor=c, limit=4),
        "following": lambda c: feed.following_timeline(viewer, cursor=c, limit=4),
        "group": lambda c: feed.group_timeline(group, viewer, cursor=c, limit=4),
        "mentions": lambda c: feed.mentions_timeline(viewer, cursor=c, limit=4),
    }
    before = [add(n) for n in range(17)]
    seen: list[int] = []
    cursor: str | None = None
    n = 100
    while True:
        page = fetch[timeline](cursor)
        seen += ids(page)
        # New activities arrive between page loads; they are newer than every page so far.
        for _ in range(3):
            add(n)
            n += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == list(reversed(before))


def delete_while_read(monkeypatch: pytest.MonkeyPatch, delete: Callable[[Any], object]) -> None:
    """Run ``delete(bound)`` each time a many-author timeline has taken the bound of its page and
    before it reads the page: another request deleting activities meanwhile."""
    from presence.feed.api import timelines

    take_bound = timelines._lower_bound

    def racing(*args: Any, **kwargs: Any) -> Any:
        bound = take_bound(*args, **kwargs)
        delete(bound)
        return bound

    monkeypatch.setattr(timelines, "_lower_bound", racing)


def test_a_page_whose_activities_were_all_deleted_while_read_goes_on_with_the_rest(
    make_user: Callable[..., Any], clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    viewer, alice, bob = make_user("viewer"), make_user("alice"), make_user("bob")
    everyone_sees(alice, bob)
    for author in (alice, bob):
        Contact.objects.create(owner=viewer, contact=author)
    older = []
    for n in range(3):
        older.append(feed.post(alice, f"alice {n}").pk)
        clock.shift(1)
    clock.shift(3600)
    for n in range(60):
        feed.post(bob, f"bob {n}")
        clock.shift(1)
    # Bob deletes every activity of his (his account) after the first page took its bound,
    # which lies among his activities.
    delete_while_read(monkeypatch, lambda bound: Activity.objects.filter(author=bob).delete())
    page = feed.following_timeline(viewer)
    assert ids(page) == list(reversed(older)) and page.next_cursor is None


def test_a_page_deleted_under_every_bound_still_shows_what_remains(
    make_user: Callable[..., Any], clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    viewer = make_user("viewer")
    authors = [make_user() for _ in range(3)]
    everyone_sees(*authors)
    for author in authors:
        Contact.objects.create(owner=viewer, contact=author)
    for author in authors:  # the first author's are the oldest, the last's the newest
        for n in range(30):
            feed.post(author, f"{n}")
            clock.shift(1)

    def delete_since(bound: Any) -> None:
        # Each time a bound is taken, everything since it is deleted at once.
        if bound.since is not None:
            Activity.objects.filter(created_at__gte=bound.since).delete()

    delete_while_read(monkeypatch, delete_since)
    page = feed.following_timeline(viewer, limit=10)
    remaining = list(Activity.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    assert remaining and ids(page) == remaining[:10]
    monkeypatch.undo()
    assert page_through(lambda c: feed.following_timeline(viewer, cursor=c, limit=10), 10) == (
        remaining
    )


def test_include_self_skips_no_followed_activity_when_some_are_deleted_while_read(
    make_user: Callable[..., Any], clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    viewer, alice, bob = make_user("viewer"), make_user("alice"), make_user("bob")
    everyone_sees(alice, bob)
    for author in (alice, bob):
        Contact.objects.create(owner=viewer, contact=author)
    own = []
    for n in range(60):  # the viewer's own, the oldest
        own.append(feed.post(viewer, f"own {n}").pk)
        clock.shift(1)
    followed = []
    for n in range(3):
        followed.append(feed.post(alice, f"alice {n}").pk)
        clock.shift(1)
    for n in range(60):
        followed.append(feed.post(bob, f"bob {n}").pk)
        clock.shift(1)
    newest_bob = followed[-10:]
    delete_while_read(
        monkeypatch, lambda bound: Activity.objects.filter(pk__in=newest_bob).delete()
    )
    first = feed.following_timeline(viewer, include_self=True)
    monkeypatch.undo()
    seen = ids(first)
    cursor = first.next_cursor
    while cursor is not None:
        page = feed.following_timeline(viewer, include_self=True, cursor=cursor)
        seen += ids(page)
        cursor = page.next_cursor
    # Every activity left, once, newest first: none of alice's skipped by the viewer's own.
    assert seen == list(reversed(own + followed[:-10]))


@pytest.mark.parametrize("timeline", ["user", "following", "group", "mentions"])
def test_invalid_cursor(timeline: str, make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    group = Group.objects.create(name="G", slug="g")
    call: dict[str, Callable[[str], Any]] = {
        "user": lambda c: feed.user_timeline(viewer, viewer, cursor=c),
        "following": lambda c: feed.following_timeline(viewer, cursor=c),
        "group": lambda c: feed.group_timeline(group, viewer, cursor=c),
        "mentions": lambda c: feed.mentions_timeline(viewer, cursor=c),
    }
    for bad in ("nope", "MS4w", "%%%"):
        with pytest.raises(InvalidInput) as raised:
            call[timeline](bad)
        assert raised.value.code == "invalid_cursor"


@pytest.mark.parametrize("limit", [0, -1, 201, True, 2.5, "5"])
def test_limit_is_checked(limit: Any, make_user: Callable[..., Any]) -> None:
    with pytest.raises(ValueError, match="limit"):
        feed.user_timeline(make_user(), None, limit=limit)


# --- every timeline against brute force, while the graph changes ---------------------------


def _random_world(rnd: random.Random, make_user: Callable[..., Any], clock: Any) -> dict[str, Any]:
    users = [make_user(f"u{n}") for n in range(14)]
    for user in users:
        level = rnd.choice([None, "everyone", "everyone", "contacts", "close_friends", "nobody"])
        if level:
            PrivacySettings.objects.create(user=user, activity_visibility=level)
    for owner in users:
        for contact in rnd.sample(users, 6):
            if contact != owner:
                Contact.objects.get_or_create(
                    owner=owner, contact=contact, defaults={"close_friend": rnd.random() < 0.3}
                )
    for _ in range(6):
        a, b = rnd.sample(users, 2)
        Block.objects.get_or_create(blocker=a, blocked=b)
    groups = [Group.objects.create(name=f"G{n}", slug=f"g{n}") for n in range(3)]
    for group, size in zip(groups, (2, 6, 12), strict=True):
        for member in rnd.sample(users, size):
            feed.join(member, group)
    for n in range(90):
        # Bursts at the same instant (ties), quiet spells, one very active user.
        clock.shift(rnd.choice([0, 0, 1, 30, 3600]))
        author = users[0] if rnd.random() < 0.3 else rnd.choice(users)
        named = " ".join(f"@{u.username}" for u in rnd.sample(users, rnd.choice([0, 0, 1, 2])))
        feed.post(author, f"post {n} {named}")
    return {"users": users, "groups": groups}


@pytest.mark.parametrize("seed", [1, 2])
def test_every_timeline_matches_brute_force(
    seed: int, make_user: Callable[..., Any], clock: Any
) -> None:
    rnd = random.Random(seed)
    world = _random_world(rnd, make_user, clock)
    users, groups = world["users"], world["groups"]
    truth = World()
    viewers = [*rnd.sample(users, 3), None]
    for n, viewer in enumerate(viewers):
        viewer_pk = viewer.pk if viewer else None
        # Small pages walk every path of the bound (many authors, few, ties); a limit of 1
        # (many pages) once per seed.
        for limit in (1, 4, 50) if n == 0 else (4, 50):

            def check(fetch: Callable[[str | None], feed.Page], want: list[int]) -> None:
                assert page_through(fetch, limit) == want  # noqa: B023

            for group in (groups[0], groups[2]):
                check(
                    lambda c, g=group: feed.group_timeline(g, viewer, cursor=c, limit=limit),  # noqa: B023
                    truth.group(group.pk, viewer_pk),
                )
            check(
                lambda c: feed.user_timeline(users[0], viewer, cursor=c, limit=limit),  # noqa: B023
                truth.user(users[0].pk, viewer_pk),
            )
            if viewer is None:
                continue
            check(
                lambda c: feed.following_timeline(viewer, cursor=c, limit=limit),  # noqa: B023
                truth.following(viewer.pk),
            )
            check(
                lambda c: feed.following_timeline(
                    viewer,  # noqa: B023
                    cursor=c,
                    limit=limit,  # noqa: B023
                    include_self=True,
                ),
                truth.following(viewer.pk, include_self=True),
            )
            check(
                lambda c: feed.mentions_timeline(viewer, cursor=c, limit=limit),  # noqa: B023
                truth.mentioning(viewer.pk),
            )


def test_each_next_page_follows_the_graph_as_it_is_then(
    make_user: Callable[..., Any], clock: Any
) -> None:
    rnd = random.Random(3)
    world = _random_world(rnd, make_user, clock)
    users, groups = world["users"], world["groups"]
    viewer = users[1]
    cursors: dict[str, str | None] = {"following": None, "group": None, "mentions": None}
    done: set[str] = set()
    for step in range(200):
        kind = rnd.choice(["following", "group", "mentions", "change"])
        if kind == "change":
            other = rnd.choice(users[2:])
            action = rnd.choice(["follow", "unfollow", "join", "leave", "block", "unblock"])
            if action == "follow":
                Contact.objects.get_or_create(owner=viewer, contact=other)
            elif action == "unfollow":
                Contact.objects.filter(owner=viewer, contact=other).delete()
            elif action == "join":
                feed.join(other, groups[1])
            elif action == "leave":
                feed.leave(other, groups[1])
            elif action == "block":
                Block.objects.get_or_create(blocker=other, blocked=viewer)
            else:
                Block.objects.filter(blocker=other, blocked=viewer).delete()
            continue
        if kind in done:
            continue
        truth = World()
        position = cursors[kind]
        fetch = {
            "following": lambda c: feed.following_timeline(viewer, cursor=c, limit=3),
            "group": lambda c: feed.group_timeline(groups[1], viewer, cursor=c, limit=3),
            "mentions": lambda c: feed.mentions_timeline(viewer, cursor=c, limit=3),
        }[kind]
        expected_all = {
            "following": truth.following(viewer.pk),
            "group": truth.group(groups[1].pk, viewer.pk),
            "mentions": truth.mentioning(viewer.pk),
        }[kind]
        if position is not None:
            from presence.feed.domain import decode_cursor

            at = decode_cursor(position)
            assert at is not None
            keys = {pk: (a.created_at, a.pk) for a in Activity.objects.all() for pk in [a.pk]}
            expected_all = [pk for pk in expected_all if keys[pk] < (at.created_at, at.id)]
        page = fetch(position)
        assert ids(page) == expected_all[:3], f"step {step}: {kind}"
        cursors[kind] = page.next_cursor
        if page.next_cursor is None:
            done.add(kind)


# --- costs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("authors_count", [8, 60])
def test_a_page_costs_a_few_queries_whatever_its_size(
    authors_count: int, make_user: Callable[..., Any], clock: Any
) -> None:
    viewer = make_user("viewer")
    authors = [make_user() for _ in range(authors_count)]
    everyone_sees(*authors)
    group = Group.objects.create(name="G", slug="g")
    for author in authors:
        Contact.objects.create(owner=viewer, contact=author)
        Membership.objects.create(group=group, user=author)
    Activity.objects.bulk_create(
        Activity(
            author=authors[n % authors_count], text=f"{n}", created_at=T0 + timedelta(seconds=n)
        )
        for n in range(120)
    )
    # The bound (one more query when fewer authors than a page have posted), the page, the
    # mentions of its activities.
    expected = 3 if authors_count > 50 else 4
    for timeline in (
        lambda: feed.following_timeline(viewer, limit=50),
        lambda: feed.group_timeline(group, viewer, limit=50),
    ):
        with CaptureQueriesContext(connection) as queries:
            page = timeline()
        assert len(page) == 50
        assert len(queries) == expected
    with CaptureQueriesContext(connection) as queries:
        page = feed.user_timeline(authors[0], viewer)
    assert len(queries) == 2
    with CaptureQueriesContext(connection) as queries:
        html = [feed.render_text(activity) for activity in page.activities]
    assert len(queries) == 0 and html


def test_the_mentions_page_costs_two_queries(make_user: Callable[..., Any], clock: Any) -> None:
    viewer = make_user("viewer")
    author = make_user()
    everyone_sees(author)
    for n in range(60):
        clock.shift(1)
        feed.post(author, f"{n} @viewer")
    with CaptureQueriesContext(connection) as queries:
        page = feed.mentions_timeline(viewer, limit=50)
    assert len(page) == 50 and len(queries) == 2
    assert all("@viewer" in feed.render_text(activity) for activity in page.activities)


# --- rendering ------------------------------------------------------------------------------


@pytest.mark.skipif(
    not apps.is_installed("siteproject.demo"), reason="links to the demo's profile pages"
)
def test_render_text_escapes_and_links_mentions(
    make_user: Callable[..., Any], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_user("bob")
    author = make_user("author")
    activity = feed.post(author, "<b>hi</b> @BOB & @ghost, mail bob@x.org @bob.")
    assert feed.render_text(activity, "demo:profile") == (
        '&lt;b&gt;hi&lt;/b&gt; <a class="mention" href="/u/bob/">@BOB</a> &amp; @ghost, '
        'mail bob@x.org <a class="mention" href="/u/bob/">@bob</a>.'
    )
    # Without a URL: no link, but still marked.
    assert feed.render_text(activity).startswith(
        '&lt;b&gt;hi&lt;/b&gt; <span class="mention">@BOB</span>'
    )
    settings.PRESENCE_FEED = {"MENTION_URL": "demo:profile"}
    assert '<a class="mention" href="/u/bob/">@BOB</a>' in feed.render_text(activity)
    settings.PRESENCE_FEED = {}
    # What ABSOLUTE_URL_OVERRIDES = {"auth.user": ...} gives the user model when it loads.
    monkeypatch.setattr(User, "get_absolute_url", lambda user: f"/people/{user.pk}", raising=False)
    bob = User.objects.get(username="bob")
    assert f'<a class="mention" href="/people/{bob.pk}">@BOB</a>' in feed.render_text(
        Activity.objects.get(pk=activity.pk)
    )


def test_rendering_links_no_name_the_post_did_not_resolve_to_the_stored_user(
    make_user: Callable[..., Any],
) -> None:
    """``Ann`` is mentioned as written; ``@ANN`` named nobody (``Ann`` and ``ann`` both match
    it ignoring case) and ``@ann`` names ``ann``, who blocked the author (not stored): neither
    is linked to ``Ann``."""
    ann, other_ann = make_user("Ann"), make_user("ann")
    author = make_user("author")
    Block.objects.create(blocker=other_ann, blocked=author)
    activity = feed.post(author, "hi @Ann, @ANN and @ann")
    assert [m.user for m in feed.mentions_of(activity)] == [ann]
    assert feed.render_text(Activity.objects.get(pk=activity.pk)) == (
        'hi <span class="mention">@Ann</span>, @ANN and @ann'
    )


def test_rendering_uses_the_mentions_stored_when_posted(make_user: Callable[..., Any]) -> None:
    author = make_user("author")
    activity = feed.post(author, "hi @later")
    make_user("later")  # joined after the post: the post did not mention them
    assert feed.render_text(Activity.objects.get(pk=activity.pk), "demo:profile") == "hi @later"


def test_a_longer_name_of_a_user_not_mentioned_is_never_linked_to_a_shorter_one(
    make_user: Callable[..., Any],
) -> None:
    """``@bob.smith`` names bob.smith, who blocked the author (so is not mentioned): it stays
    plain text, not a mention of bob reaching into it."""
    bob, bob_smith = make_user("bob"), make_user("bob.smith")
    author = make_user("author")
    Block.objects.create(blocker=bob_smith, blocked=author)
    activity = feed.post(author, "thanks @bob and @bob.smith")
    assert [m.user for m in feed.mentions_of(activity)] == [bob]
    assert feed.render_text(Activity.objects.get(pk=activity.pk)) == (
        'thanks <span class="mention">@bob</span> and @bob.smith'
    )


def test_a_stored_mention_stays_linked_whoever_signs_up_or_renames_later(
    make_user: Callable[..., Any],
) -> None:
    ann = make_user("Ann")
    author = make_user("author")
    activity = feed.post(author, "hi @ANN")
    assert [m.user for m in feed.mentions_of(activity)] == [ann]
    make_user("ann")  # "@ANN" would be ambiguous now: it was not when posted
    expected = 'hi <span class="mention">@ANN</span>'
    assert feed.render_text(Activity.objects.get(pk=activity.pk)) == expected
    ann.username = "Annie"  # the link follows her, where the post named her
    ann.save()
    assert feed.render_text(Activity.objects.get(pk=activity.pk)) == expected
    shown = feed.activity_as_dict(Activity.objects.get(pk=activity.pk))
    assert shown["mentions"] == [{"id": wire_id(ann), "username": "Annie"}]


def test_rendering_a_page_costs_no_query_whatever_case_its_mentions_use(
    make_user: Callable[..., Any], clock: Any
) -> None:
    viewer, author, bob = make_user("viewer"), make_user("author"), make_user("bob")
    emile = make_user("Émile")
    everyone_sees(author)
    Contact.objects.create(owner=viewer, contact=author)
    for n in range(30):
        feed.post(author, f"{n} hi @BOB, @Bob, @bob and @ÉMILE")
        clock.shift(1)
    page = feed.following_timeline(viewer)
    with CaptureQueriesContext(connection) as queries:
        shown = [feed.activity_as_dict(activity) for activity in page.activities]
    assert len(queries) == 0
    assert len(shown) == 30 and all(item["html"].count('class="mention"') == 4 for item in shown)
    assert shown[0]["mentions"] == [
        {"id": wire_id(bob), "username": "bob"},
        {"id": wire_id(emile), "username": "Émile"},
    ]


def test_a_mention_without_recorded_places_is_found_by_its_handle(
    make_user: Callable[..., Any],
) -> None:
    """Mentions from before their places were recorded (or added in the admin) still link:
    their user's handle where the text names it, among the stored mentions."""
    bob, carol = make_user("bob"), make_user("carol")
    author = make_user("author")
    activity = feed.post(author, "hi @BOB and @carol, @bob.x")
    Mention.objects.filter(activity=activity).update(spans=None)
    assert feed.render_text(Activity.objects.get(pk=activity.pk)) == (
        'hi <span class="mention">@BOB</span> and <span class="mention">@carol</span>, '
        '<span class="mention">@bob</span>.x'
    )
    assert {m.user for m in Mention.objects.filter(activity=activity)} == {bob, carol}


def test_activity_as_dict(make_user: Callable[..., Any], clock: Any) -> None:
    bob = make_user("bob")
    author = make_user("author")
    activity = feed.post(author, "hi @bob")
    # (Links to profiles: test_render_text_escapes_and_links_mentions.) Ids as in JSON: an
    # integer as a number, a UUID as its text.
    assert feed.activity_as_dict(activity) == {
        "id": activity.pk,
        "kind": "post",
        "author": {"id": wire_id(author), "username": "author"},
        "text": "hi @bob",
        "html": 'hi <span class="mention">@bob</span>',
        "mentions": [{"id": wire_id(bob), "username": "bob"}],
        "created_at": T0.isoformat(),
    }


def test_usernames_starting_with(make_user: Callable[..., Any]) -> None:
    viewer = make_user("viewer")
    for name in ("alice", "Alfred", "albert", "bob", "alan"):
        make_user(name)
    make_user("alex", is_active=False)
    Block.objects.create(blocker=User.objects.get(username="albert"), blocked=viewer)
    found = [u.username for u in feed.usernames_starting_with("al", viewer)]
    assert found == ["alan", "Alfred", "alice"]
    assert [u.username for u in feed.usernames_starting_with("AL", viewer, limit=1)] == ["alan"]


# --- custom status changes as activities ----------------------------------------------------


def test_status_changes_are_recorded_only_when_enabled(
    make_user: Callable[..., Any], settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    user, bob = make_user("user"), make_user("bob")

    def set_status(text: str | None, status: str = "auto") -> None:
        with django_capture_on_commit_callbacks(execute=True):
            api.set_status(user, status, text=text)

    set_status("Off by default")
    assert not Activity.objects.exists()

    settings.PRESENCE_FEED = {"RECORD_STATUS_ACTIVITIES": True}
    set_status("At the gym with @bob")
    set_status("At the gym with @bob", status="dnd")  # same text: no new activity
    set_status(None)  # cleared: nothing to record
    set_status("At the gym with @bob")  # set again after clearing: recorded
    set_status("Home")
    recorded = list(Activity.objects.order_by("id").values_list("text", "kind"))
    assert recorded == [
        ("At the gym with @bob", ActivityKind.STATUS),
        ("At the gym with @bob", ActivityKind.STATUS),
        ("Home", ActivityKind.STATUS),
    ]
    assert Mention.objects.filter(user=bob).count() == 2


def test_a_status_set_again_once_it_cleared_by_its_expiry_is_recorded(
    make_user: Callable[..., Any],
    settings: Any,
    django_capture_on_commit_callbacks: Any,
    clock: Any,
) -> None:
    """An expired custom status is shown to nobody: the same text set again is a new text."""
    user = make_user()
    settings.PRESENCE_FEED = {"RECORD_STATUS_ACTIVITIES": True}

    def set_status(**fields: Any) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            api.set_status(user, "auto", text="At the gym", **fields)

    set_status(expires_at=at(1800))
    clock.move_to(at(1799))
    set_status(expires_at=at(1800))  # still shown: the same text, nothing new
    clock.move_to(at(1800))
    assert api.get_presence(user, user).text is None  # cleared
    set_status()
    texts = list(Activity.objects.order_by("id").values_list("text", flat=True))
    assert texts == ["At the gym", "At the gym"]


def test_a_status_that_cannot_be_an_activity_is_still_set(
    make_user: Callable[..., Any],
    settings: Any,
    django_capture_on_commit_callbacks: Any,
    caplog: Any,
) -> None:
    user = make_user()
    settings.PRESENCE_FEED = {"RECORD_STATUS_ACTIVITIES": True, "ACTIVITY_MAX_LENGTH": 3}
    with django_capture_on_commit_callbacks(execute=True):
        presence = api.set_status(user, "auto", text="Too long for a post")
    assert presence.text == "Too long for a post"
    assert not Activity.objects.exists()
    assert "could not record the status" in caplog.text


def test_memberships_are_unique(make_user: Callable[..., Any]) -> None:
    user = make_user()
    group = Group.objects.create(name="G", slug="g")
    Membership.objects.create(group=group, user=user)
    with pytest.raises(IntegrityError):
        Membership.objects.create(group=group, user=user)


def test_deleting_a_user_deletes_their_activities_and_mentions(
    make_user: Callable[..., Any],
) -> None:
    author, bob = make_user(), make_user("bob")
    feed.post(author, "hi @bob")
    bob.delete()
    assert Activity.objects.count() == 1 and not Mention.objects.exists()
    author.delete()
    assert not Activity.objects.exists()


def test_clock_helper_sanity(clock: Any) -> None:
    # The timelines above rely on a frozen clock: posts made without a shift share created_at.
    from django.utils import timezone

    first = timezone.now()
    clock.shift(timedelta(seconds=1))
    assert timezone.now() - first == timedelta(seconds=1)


# --- mentions across a block ----------------------------------------------------------------


@pytest.mark.parametrize("direction", ["author_blocks", "author_is_blocked"])
def test_no_mention_is_stored_across_a_block(make_user: Callable[..., Any], direction: str) -> None:
    author, blocked, friend = make_user("author"), make_user("blocked"), make_user("friend")
    for viewer in (blocked, friend):  # both may see the author's activities (contacts)
        Contact.objects.create(owner=author, contact=viewer)
    if direction == "author_blocks":
        Block.objects.create(blocker=author, blocked=blocked)
    else:
        Block.objects.create(blocker=blocked, blocked=author)
    activity = feed.post(author, "Hi @blocked and @friend")
    assert list(Mention.objects.values_list("user", flat=True)) == [friend.pk]
    # Unblocking does not bring the mention back, and the name stays plain text.
    Block.objects.all().delete()
    assert list(feed.mentions_timeline(blocked)) == []
    assert [a.pk for a in feed.mentions_timeline(friend)] == [activity.pk]
    html = str(feed.render_text(Activity.objects.get()))
    assert "Hi @blocked and" in html and html.count('class="mention"') == 1


# --- public handles (HANDLE_FIELD) -----------------------------------------------------------


def test_a_handle_that_is_an_email_address_is_never_shown_suggested_or_mentioned(
    make_user: Callable[..., Any],
) -> None:
    author = make_user("author")
    make_user("ann@example.com")  # a site whose usernames are e-mail addresses
    activity = feed.post(author, "Hi @ann@example.com and @ann")
    assert list(Mention.objects.filter(activity=activity)) == []
    assert feed.usernames_starting_with("an", author) == []
    shown = feed.activity_as_dict(activity)
    assert "ann@example.com" not in str(shown["mentions"])


def test_a_handle_shared_by_several_users_mentions_none_of_them(
    make_user: Callable[..., Any], settings: Any
) -> None:
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "first_name"}  # not unique (presence_feed.W003)
    author = make_user("author", first_name="Author")
    make_user("sam1", first_name="sam")
    make_user("sam2", first_name="sam")
    ann = make_user("ann1", first_name="ann")
    activity = feed.post(author, "Lunch, @sam, @Sam, @sam.x and @ann?")
    assert [mention.user for mention in Mention.objects.filter(activity=activity)] == [ann]
    assert feed.render_text(activity) == (
        'Lunch, @sam, @Sam, @sam.x and <span class="mention">@ann</span>?'
    )


def test_handle_field_names_the_public_handle(make_user: Callable[..., Any], settings: Any) -> None:
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "first_name"}
    author = make_user("author@example.com", first_name="Author")
    ann = make_user("ann@example.com", first_name="ann")
    Contact.objects.create(owner=author, contact=ann)
    activity = feed.post(author, "Lunch, @ann?")
    assert [mention.user for mention in Mention.objects.filter(activity=activity)] == [ann]
    assert [user.pk for user in feed.usernames_starting_with("AN", author)] == [ann.pk]
    shown = feed.activity_as_dict(activity)
    assert shown["author"] == {"id": wire_id(author), "username": "Author"}
    assert shown["mentions"] == [{"id": wire_id(ann), "username": "ann"}]
    assert "@example.com" not in str(shown)
