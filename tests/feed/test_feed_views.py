"""The feed's JSON endpoints: exact answers, paging, privacy, login, CSRF, methods, bad input."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.crypto import get_random_string

from presence.feed import api as feed
from presence.feed.models import Activity, Group, Membership, Mention
from presence.models import Block, Contact, PrivacySettings
from tests.clock import T0, at
from tests.feed_cases import (
    FEED_CASE_IDS,
    FEED_CASES,
    MEMBERS_READ_GROUPS,
    READS_NOTHING,
    RECORDED_MEMBERS_READ_GROUPS,
    RULE_THAT_RAISES,
    admitted,
    build_case,
    rule_calls,
)
from tests.ids import missing_id, uid, wire_id

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]

FOLLOWING = "/presence/api/feed/following"
MENTIONS = "/presence/api/feed/mentions"
POST = "/presence/api/feed/post"
SUGGEST = "/presence/api/feed/mention-suggestions"


def user_url(pk: Any) -> str:
    return f"/presence/api/feed/user/{pk}"


def group_url(slug: str, action: str = "") -> str:
    return f"/presence/api/feed/group/{slug}" + (f"/{action}" if action else "")


def _error(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


def _post(client: Client, url: str, data: Any = None, **extra: Any) -> Any:
    body = data if isinstance(data, str | bytes) else json.dumps(data if data is not None else {})
    return client.post(url, body, content_type="application/json", **extra)


@pytest.fixture
def alice(make_user: Callable[..., Any]) -> Any:
    return make_user("alice")


@pytest.fixture
def client(alice: Any) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def test_urls_are_named() -> None:
    assert reverse("presence_feed:feed-following") == FOLLOWING
    assert reverse("presence_feed:feed-mentions") == MENTIONS
    assert reverse("presence_feed:feed-user", args=[7]) == user_url(7)
    assert reverse("presence_feed:feed-group", args=["book-club"]) == group_url("book-club")
    assert reverse("presence_feed:feed-group-join", args=["x"]) == group_url("x", "join")
    assert reverse("presence_feed:feed-group-leave", args=["x"]) == group_url("x", "leave")
    assert reverse("presence_feed:feed-post") == POST
    assert reverse("presence_feed:feed-mention-suggestions") == SUGGEST


# --- answers --------------------------------------------------------------------------------


def followed_by(alice: Any, make_user: Callable[..., Any]) -> Any:
    """bob, who shares his activity with everyone, followed by alice."""
    bob = make_user("bob")
    PrivacySettings.objects.create(user=bob, activity_visibility="everyone")
    Contact.objects.create(owner=alice, contact=bob)
    return bob


def test_following_includes_the_callers_own_activities_when_asked(
    clock: Any, client: Client, alice: Any, make_user: Callable[..., Any]
) -> None:
    bob = followed_by(alice, make_user)
    theirs = feed.post(bob, "theirs")
    clock.move_to(at(1))
    mine = feed.post(alice, "mine")

    def ids(**query: str) -> list[int]:
        response = client.get(FOLLOWING, query)
        assert response.status_code == 200, response.content
        return [a["id"] for a in response.json()["activities"]]

    assert ids() == ids(include_self="0") == [theirs.pk]
    assert ids(include_self="1") == ids(include_self="true") == [mine.pk, theirs.pk]
    response = client.get(FOLLOWING, {"include_self": "yes"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_value"


def test_following_answers_exact_json_and_pages_by_cursor(
    clock: Any, client: Client, alice: Any, make_user: Callable[..., Any]
) -> None:
    # (clock first: the session is made at the frozen time)
    bob = followed_by(alice, make_user)
    posted = []
    for n in range(51):
        clock.move_to(at(n))
        posted.append(feed.post(bob, f"post {n} @alice <ok>"))
    body = client.get(FOLLOWING).json()
    assert set(body) == {"activities", "next_cursor"}
    assert len(body["activities"]) == 50
    newest = posted[-1]
    assert body["activities"][0] == {
        "id": newest.pk,
        "kind": "post",
        "author": {"id": wire_id(bob), "username": "bob"},
        "text": "post 50 @alice <ok>",
        "html": 'post 50 <span class="mention">@alice</span> &lt;ok&gt;',
        "mentions": [{"id": wire_id(alice), "username": "alice"}],
        "created_at": "2030-01-07T09:30:50+00:00",
    }
    assert [a["id"] for a in body["activities"]] == [a.pk for a in reversed(posted[1:])]
    assert isinstance(body["next_cursor"], str)
    rest = client.get(FOLLOWING, {"cursor": body["next_cursor"]}).json()
    assert rest == {
        "activities": [
            {
                "id": posted[0].pk,
                "kind": "post",
                "author": {"id": wire_id(bob), "username": "bob"},
                "text": "post 0 @alice <ok>",
                "html": 'post 0 <span class="mention">@alice</span> &lt;ok&gt;',
                "mentions": [{"id": wire_id(alice), "username": "alice"}],
                "created_at": T0.isoformat(),
            }
        ],
        "next_cursor": None,
    }
    assert [a["id"] for a in client.get(MENTIONS).json()["activities"]][:2] == [
        posted[-1].pk,
        posted[-2].pk,
    ]


def test_user_and_group_timelines(
    client: Client, alice: Any, make_user: Callable[..., Any]
) -> None:
    bob = make_user("bob")
    PrivacySettings.objects.create(user=bob, activity_visibility="everyone")
    group = Group.objects.create(name="Book club", slug="book-club")
    activity = feed.post(bob, "hello")
    assert [a["id"] for a in client.get(user_url(bob.pk)).json()["activities"]] == [activity.pk]
    assert client.get(group_url("book-club")).json() == {"activities": [], "next_cursor": None}
    Membership.objects.create(group=group, user=bob)
    assert [a["id"] for a in client.get(group_url("book-club")).json()["activities"]] == [
        activity.pk
    ]


@pytest.mark.privacy_matrix
@pytest.mark.parametrize(("level", "relation"), FEED_CASES, ids=FEED_CASE_IDS)
def test_privacy_matrix_through_http(
    level: str | None, relation: str, make_user: Callable[..., Any]
) -> None:
    scenario = build_case(level, relation, make_user)
    client = Client()
    urls = [user_url(scenario.author.pk), group_url(scenario.group.slug), FOLLOWING, MENTIONS]
    if scenario.viewer is None:
        for url in urls:
            _error(client.get(url), 401, "not_authenticated")
        return
    client.force_login(scenario.viewer)
    want = [scenario.activity.pk] if admitted(level, relation) else []
    for url in urls[:2] + ([] if relation == "self" else urls[2:3]) + urls[3:]:
        got = [a["id"] for a in client.get(url).json()["activities"]]
        assert got == want, url


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", FOLLOWING),
        ("get", MENTIONS),
        ("get", user_url(uid(1))),
        ("get", group_url("g")),
        ("get", SUGGEST),
        ("post", POST),
        ("post", group_url("g", "join")),
        ("post", group_url("g", "leave")),
    ],
)
@pytest.mark.parametrize("enforce_csrf", [False, True])
def test_anonymous_callers_get_401_json(method: str, url: str, enforce_csrf: bool) -> None:
    Group.objects.create(name="G", slug="g")
    client = Client(enforce_csrf_checks=enforce_csrf)
    response = getattr(client, method)(url, content_type="application/json")
    _error(response, 401, "not_authenticated")
    assert not response.has_header("Location")
    assert response["Cache-Control"].startswith("max-age=0")
    assert not Activity.objects.exists() and not Membership.objects.exists()


@pytest.mark.parametrize(
    ("method", "url", "allow"),
    [
        ("post", FOLLOWING, "GET"),
        ("delete", MENTIONS, "GET"),
        ("post", user_url(uid(1)), "GET"),
        ("get", POST, "POST"),
        ("get", group_url("g", "join"), "POST"),
        ("put", group_url("g", "leave"), "POST"),
    ],
)
def test_wrong_methods_get_405_json(client: Client, method: str, url: str, allow: str) -> None:
    response = getattr(client, method)(url)
    _error(response, 405, "method_not_allowed")
    assert response["Allow"] == allow


@pytest.mark.parametrize("url", [FOLLOWING, MENTIONS, user_url(uid(1)), group_url("g")])
@pytest.mark.parametrize("cursor", ["nope", "MS4w", "é", "x" * 100])
def test_invalid_cursor_is_400(client: Client, alice: Any, url: str, cursor: str) -> None:
    Group.objects.create(name="G", slug="g")
    url = url.replace(user_url(uid(1)), user_url(alice.pk))
    message = _error(client.get(url, {"cursor": cursor}), 400, "invalid_cursor")
    assert message == "The cursor is not valid: use the one a page returned."


def test_unknown_group_and_user_are_404_json(client: Client) -> None:
    assert _error(client.get(group_url("nope")), 404, "unknown_group") == "No group 'nope'."
    for action in ("join", "leave"):
        _error(_post(client, group_url("nope", action)), 404, "unknown_group")
    nobody = missing_id()
    assert _error(client.get(user_url(nobody)), 404, "unknown_user") == f"No user {nobody}."
    assert not Membership.objects.exists()


def test_a_group_the_sites_rule_refuses_is_answered_as_one_that_does_not_exist(
    client: Client, alice: Any, make_user: Callable[..., Any], settings: Any
) -> None:
    """PRESENCE_FEED["CAN_READ"]: a private group's timeline to its members only, over HTTP
    as over the socket (watch_feed); a refusal is the 404 of a group that does not exist (which
    private groups exist is not told), and such a group cannot be joined here either."""
    settings.PRESENCE_FEED = {"CAN_READ": MEMBERS_READ_GROUPS}
    member = make_user("member")
    PrivacySettings.objects.create(user=member, activity_visibility="everyone")
    group = Group.objects.create(name="Secret", slug="secret")
    feed.join(member, group)
    activity = feed.post(member, "members only")
    refused = _error(client.get(group_url("secret")), 404, "unknown_group")
    assert refused == "No group 'secret'."
    for action in ("join", "leave"):
        _error(_post(client, group_url("secret", action)), 404, "unknown_group")
    assert not feed.is_member(alice, group)
    # Its member reads it; the other timelines are open (the rule's choice).
    member_client = Client()
    member_client.force_login(member)
    read = member_client.get(group_url("secret")).json()["activities"]
    assert [a["id"] for a in read] == [activity.pk]
    assert [a["id"] for a in client.get(user_url(member.pk)).json()["activities"]] == [activity.pk]


def test_the_rule_is_asked_whether_or_not_the_group_or_user_exists(
    client: Client, alice: Any, settings: Any
) -> None:
    """A refused group is answered as a missing one and costs what one does: the rule is asked
    of both (it ran for existing groups only: one query more, so the time of a 404 told which
    private groups exist), for the timeline, a join and a leave, and for users alike."""
    settings.PRESENCE_FEED = {"CAN_READ": RECORDED_MEMBERS_READ_GROUPS}
    Group.objects.create(name="Secret", slug="secret")
    rule_calls.clear()
    queries: dict[str, int] = {}
    for slug in ("secret", "nosuch"):
        with CaptureQueriesContext(connection) as captured:
            _error(client.get(group_url(slug)), 404, "unknown_group")
        queries[slug] = len(captured.captured_queries)
        for action in ("join", "leave"):
            _error(_post(client, group_url(slug, action)), 404, "unknown_group")
    assert queries["secret"] == queries["nosuch"]
    nobody = missing_id()
    _error(client.get(user_url(nobody)), 404, "unknown_user")
    assert [
        *[(alice.pk, "group:secret")] * 3,
        *[(alice.pk, "group:nosuch")] * 3,
        (alice.pk, f"user:{nobody}"),
    ] == rule_calls


def test_a_rule_that_refuses_or_raises_closes_every_timeline(
    client: Client, alice: Any, make_user: Callable[..., Any], settings: Any
) -> None:
    bob = make_user("bob")
    Group.objects.create(name="Open", slug="open")
    for rule in (READS_NOTHING, RULE_THAT_RAISES):
        settings.PRESENCE_FEED = {"CAN_READ": rule}
        for url in (FOLLOWING, MENTIONS):
            name = url.rsplit("/", 1)[1]
            assert _error(client.get(url), 404, "unknown_feed") == f"No such timeline: {name}."
        assert _error(client.get(user_url(bob.pk)), 404, "unknown_user") == f"No user {bob.pk}."
        _error(client.get(group_url("open")), 404, "unknown_group")
    # A path that names no function refuses everyone too (presence_feed.E004 reports it).
    settings.PRESENCE_FEED = {"CAN_READ": "tests.feed_cases.no_such_rule"}
    _error(client.get(FOLLOWING), 404, "unknown_feed")


@pytest.mark.parametrize("segment", ["abc", "-1", "1.0", "%00", "%C3%A9", "%20", "x" * 300])
def test_ids_and_slugs_that_cannot_be_one_are_404_json_too(client: Client, segment: str) -> None:
    """Not Django's HTML 404 page: an id the pk cannot be names no user, and a slug of other
    characters no group, and they are answered in JSON as every other error (found by
    tests/core/test_fuzz_http.py; NUL never reaches the database, which PostgreSQL would refuse)."""
    Group.objects.create(name="G", slug="g")
    _error(client.get(user_url(segment)), 404, "unknown_user")
    _error(client.get(group_url(segment)), 404, "unknown_group")
    for action in ("join", "leave"):
        _error(_post(client, group_url(segment, action)), 404, "unknown_group")
    assert not Membership.objects.exists()
    # The other kind of key: a UUID on an integer-keyed site, a number on a UUID-keyed one.
    other = str(uuid.UUID(int=1)) if isinstance(missing_id(), int) else "12"
    _error(client.get(user_url(other)), 404, "unknown_user")


# --- posting --------------------------------------------------------------------------------


def test_post_answers_201_with_the_activity(
    clock: Any, client: Client, alice: Any, make_user: Callable[..., Any]
) -> None:
    bob = make_user("bob")
    response = _post(client, POST, {"text": " Hi @bob! "})
    assert response.status_code == 201
    activity = Activity.objects.get()
    assert response.json() == {
        "activity": {
            "id": activity.pk,
            "kind": "post",
            "author": {"id": wire_id(alice), "username": "alice"},
            "text": "Hi @bob!",
            "html": 'Hi <span class="mention">@bob</span>!',
            "mentions": [{"id": wire_id(bob), "username": "bob"}],
            "created_at": T0.isoformat(),
        }
    }
    assert Mention.objects.get().user == bob


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"text": ""}, "invalid_value"),
        ({"text": "  \n "}, "invalid_value"),
        ({"text": "x" * 501}, "invalid_value"),
        ({"text": "nul\x00 @bob"}, "invalid_value"),
        ({"text": None}, "invalid_message"),
        ({"text": 5}, "invalid_message"),
        ({}, "invalid_message"),
        ([{"text": "hi"}], "invalid_message"),
        ("not json", "invalid_json"),
        ("[" * 100_000, "payload_too_large"),
        ("", "invalid_json"),
    ],
)
def test_bad_posts_are_400_and_save_nothing(
    client: Client, make_user: Callable[..., Any], body: Any, code: str
) -> None:
    make_user("bob")
    _error(_post(client, POST, body), 400, code)
    assert not Activity.objects.exists() and not Mention.objects.exists()


def test_the_longest_post_fits_the_body_limit(client: Client) -> None:
    text = "😀" * 500  # 12 bytes each as a JSON escape
    body = json.dumps({"text": text})
    assert _post(client, POST, body).status_code == 201


def test_posting_and_joining_enforce_csrf(client: Client, alice: Any) -> None:
    Group.objects.create(name="G", slug="g")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    for url, data, model in (
        (POST, {"text": "hi"}, Activity),
        (group_url("g", "join"), None, Membership),
    ):
        strict.cookies.pop("csrftoken", None)
        _error(_post(strict, url, data), 403, "csrf_failed")
        secret = get_random_string(32)
        strict.cookies["csrftoken"] = secret
        _error(_post(strict, url, data, HTTP_X_CSRFTOKEN="y" * 32), 403, "csrf_failed")
        assert not model.objects.exists()
        assert _post(strict, url, data, HTTP_X_CSRFTOKEN=secret).status_code in {200, 201}
        assert model.objects.count() == 1


def test_join_and_leave(client: Client, alice: Any, make_user: Callable[..., Any]) -> None:
    group = Group.objects.create(name="Book club", slug="book-club")
    Membership.objects.create(group=group, user=make_user())
    joined = {"group": {"slug": "book-club", "name": "Book club", "member": True, "members": 2}}
    assert _post(client, group_url("book-club", "join")).json() == joined
    assert _post(client, group_url("book-club", "join")).json() == joined  # idempotent
    left = {"group": {"slug": "book-club", "name": "Book club", "member": False, "members": 1}}
    assert _post(client, group_url("book-club", "leave")).json() == left
    assert _post(client, group_url("book-club", "leave")).json() == left


# --- mention completion ---------------------------------------------------------------------


def test_mention_suggestions(client: Client, alice: Any, make_user: Callable[..., Any]) -> None:
    albert, alan = make_user("albert"), make_user("Alan")
    make_user("bob")
    blocker = make_user("alex")
    Block.objects.create(blocker=blocker, blocked=alice)
    assert client.get(SUGGEST, {"q": "al"}).json() == {
        "users": [
            {"id": wire_id(alan), "username": "Alan"},
            {"id": wire_id(albert), "username": "albert"},
            {"id": wire_id(alice), "username": "alice"},
        ]
    }
    assert client.get(SUGGEST, {"q": "@ALB"}).json() == {
        "users": [{"id": wire_id(albert), "username": "albert"}]
    }
    assert client.get(SUGGEST, {"q": ""}).json() == {"users": []}
    assert client.get(SUGGEST).json() == {"users": []}
    _error(client.get(SUGGEST, {"q": "a" * 151}), 400, "invalid_value")


def test_errors_follow_the_language(client: Client) -> None:
    message = _error(client.get(group_url("nope"), HTTP_ACCEPT_LANGUAGE="en"), 404, "unknown_group")
    assert message == "No group 'nope'."


# --- text the database cannot store, or that misleads readers -------------------------------

UNSTORABLE = {"surrogate": "hi \ud800", "nul": "a\x00b", "rlo": "x\u202ey"}


@pytest.mark.parametrize("bad", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_post_with_unstorable_text_is_400_and_saves_nothing(client: Client, bad: str) -> None:
    _error(_post(client, POST, {"text": bad}), 400, "invalid_value")
    assert not Activity.objects.exists()


@pytest.mark.parametrize("query", ["\x00", "al\x00", "@\x00ice", "a\u202e"])
def test_mention_suggestions_refuse_nul_and_controls(
    client: Client, make_user: Callable[..., Any], query: str
) -> None:
    make_user("alina")
    _error(client.get(SUGGEST, {"q": query}), 400, "invalid_value")
