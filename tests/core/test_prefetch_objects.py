"""``{% presence_prefetch objects "path" %}`` (issue 38): the users a page of posts or comments
carries (``"author"``, ``"activity.author"``) are read in one go: a bounded number of queries and
one Redis round trip whatever the number of objects, and the template's
``{{ post.author }}`` then costs nothing. A bad path is a TemplateSyntaxError naming it.

The objects here are the activity feed's (``Activity.author``, ``Mention.activity``), a site's
posts and comments as far as presence can tell."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.template import TemplateSyntaxError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from presence import api
from presence.domain import Status
from presence.feed.models import Activity, Mention
from presence.models import PrivacySettings
from presence.rendering import dot_html
from presence.store import get_store
from tests.core.test_templatetags import render, request_for
from tests.privacy_cases import count_round_trips

pytestmark = pytest.mark.django_db

DOTS = "{% for post in posts %}{% presence_dot post.author %}{% endfor %}"


def page_of(make_user: Callable[..., Any], size: int) -> tuple[list[Any], list[Activity]]:
    """``size`` posts, each by its own author; the even ones are online, for everyone."""
    authors = [make_user() for _ in range(size)]
    for author in authors[::2]:
        PrivacySettings.objects.create(user=author, online_visibility="everyone")
        api.touch(author)
    posts = [Activity.objects.create(author=author, text="hello") for author in authors]
    get_store().client.ping()  # connect before counting
    return authors, posts


def dot(user: Any, status: str) -> str:
    return str(dot_html(user.pk, Status(status)))


def expected_dots(authors: list[Any]) -> str:
    return "".join(dot(a, "online" if i % 2 == 0 else "offline") for i, a in enumerate(authors))


def cost(source: str, viewer: Any, **context: Any) -> tuple[str, int, int]:
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        html = render(source, request_for(viewer), **context)
    return html, len(queries), trips.count


@pytest.mark.parametrize("size", [3, 30])
def test_a_page_of_posts_costs_the_same_whatever_its_length(
    size: int, make_user: Callable[..., Any]
) -> None:
    viewer = make_user()
    authors, _ = page_of(make_user, size)
    posts = Activity.objects.order_by("pk")  # not read yet: the prefetch reads it once
    html, queries, trips = cost(
        '{% presence_prefetch posts "author" %}' + DOTS, viewer, posts=posts
    )
    assert html == expected_dots(authors)
    # The posts, their authors, the authors' privacy facts; one Redis round trip.
    assert (queries, trips) == (3, 1)


def test_without_the_path_each_author_costs_its_own_reads(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    authors, _ = page_of(make_user, 10)
    posts = list(Activity.objects.order_by("pk"))
    html, queries, trips = cost(DOTS, viewer, posts=posts)
    assert html == expected_dots(authors)
    assert queries >= 20 and trips == 10  # an author and a presence read per post


def test_a_dotted_path_through_a_relation(make_user: Callable[..., Any]) -> None:
    """Mentions of the viewer, each showing its post's author: ``"activity.author"``."""
    viewer = make_user()
    authors, posts = page_of(make_user, 6)
    for post in posts:
        Mention.objects.create(activity=post, user=viewer, created_at=timezone.now())
    mentions = list(Mention.objects.order_by("pk"))
    source = (
        '{% presence_prefetch mentions "activity.author" %}'
        "{% for m in mentions %}{% presence_dot m.activity.author %}{% endfor %}"
    )
    html, queries, trips = cost(source, viewer, mentions=mentions)
    assert html == expected_dots(authors)
    assert (queries, trips) == (3, 1)  # the posts, their authors, the privacy facts


def test_objects_already_carrying_their_users_cost_no_more(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    authors, _ = page_of(make_user, 5)
    posts = list(Activity.objects.select_related("author").order_by("pk"))
    html, queries, trips = cost(
        '{% presence_prefetch posts "author" %}' + DOTS, viewer, posts=posts
    )
    assert html == expected_dots(authors)
    assert (queries, trips) == (1, 1)


def test_plain_objects_and_ids(make_user: Callable[..., Any]) -> None:
    class Comment:
        def __init__(self, user: Any) -> None:
            self.user = user

    viewer = make_user()
    authors, _ = page_of(make_user, 4)
    comments = [Comment(authors[0]), Comment(None), Comment(authors[1].pk)]
    source = (
        '{% presence_prefetch comments "user" %}'
        "{% for c in comments %}{% presence_dot c.user %}{% endfor %}"
    )
    html, queries, trips = cost(source, viewer, comments=comments)
    assert html == dot(authors[0], "online") + dot(authors[1], "offline")
    assert (queries, trips) == (1, 1)


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("autor", "Activity has no attribute 'autor' (path 'autor', step 1)"),
        ("author.profile", "has no attribute 'profile' (path 'author.profile', step 2)"),
        ("", "'' is not an attribute path"),
        ("author..pk", "'author..pk' is not an attribute path"),
        ("author__pk", None),  # a lookup, not an attribute: no such attribute
    ],
)
def test_a_bad_path_is_a_template_syntax_error_naming_it(
    path: str, said: str | None, make_user: Callable[..., Any]
) -> None:
    viewer = make_user()
    page_of(make_user, 2)
    posts = list(Activity.objects.all())
    with pytest.raises(TemplateSyntaxError) as raised:
        render("{% presence_prefetch posts path %}", request_for(viewer), posts=posts, path=path)
    assert "presence_prefetch" in str(raised.value) and repr(path) in str(raised.value)
    if said is not None:
        assert said in str(raised.value)


def test_a_path_ending_at_no_user_is_refused(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    _, posts = page_of(make_user, 2)
    mentions = [Mention.objects.create(activity=posts[0], user=viewer, created_at=timezone.now())]
    with pytest.raises(TemplateSyntaxError, match="reaches a Activity, not a user"):
        render(
            '{% presence_prefetch mentions "activity" %}', request_for(viewer), mentions=mentions
        )
