"""Property-based fuzzing of the HTTP endpoints (hypothesis): REQUESTS_PER_RUN requests to every
endpoint of presence, its activity feed, the demo's pages and presence's admin pages, with
generated paths, query strings (repeated keys, odd unicode, huge numbers, oversize) and bodies
(JSON, forms, bytes that are not UTF-8, wrong content types, deep nesting, oversize), anonymous
and logged in, through Django's test client.

Never a 5xx, nor an error logged; presence's JSON endpoints answer every error in their
documented form (docs/http.md): ``{"error": {"code", "message"}}`` with a documented code and
status; and no request changes anything of another user (their rows, their Redis state).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
import redis
import time_machine
from django.apps import apps
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from presence import api
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus
from presence.tokens import issue_token
from tests.fuzz_cases import SCALE, SEED, dumps, edge_ints, junk_json, odd_text, redis_of_others
from tests.privacy_cases import quiet_login

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.uuid_site,
    pytest.mark.fuzz,
]

#: requests one run sends
REQUESTS_PER_RUN = 3_000 * SCALE
#: requests per hypothesis example
REQUESTS_PER_EXAMPLE = 10
#: presence's endpoint limits (presence.views, presence.feed: 12 bytes a character + 1 KB)
STATUS_BODY_LIMIT = 4096
POST_BODY_LIMIT = 12 * 500 + 1024

#: every error code of the JSON endpoints, and its status (docs/http.md)
ERROR_STATUS = {
    "missing_users": 400,
    "invalid_users": 400,
    "too_many_users": 400,
    "invalid_json": 400,
    "invalid_message": 400,
    "invalid_value": 400,
    "payload_too_large": 400,
    "invalid_cursor": 400,
    "not_authenticated": 401,
    "csrf_failed": 403,
    "unknown_user": 404,
    "unknown_group": 404,
    "method_not_allowed": 405,
    "rate_limited": 429,
}
RELATION_ACTIONS = ("follow", "unfollow", "close-friend", "unclose-friend", "block", "unblock")
GROUP_ACTIONS = ("join", "leave")
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/json; charset=latin-1",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=fuzz",
    "multipart/form-data",
    "text/plain",
    "",
    "application/\u00e9",
]
LANGUAGES = ["en", "ja", "vi", "zh-hans", "*", "xx-\u00e9;q=2", "en;q=abc", ",,,", "a" * 300]


@dataclass(frozen=True)
class Endpoint:
    name: str
    #: the path, with ``{}`` where a fuzzed segment goes (or segments, for two)
    path: str
    methods: tuple[str, ...]
    #: presence's JSON endpoints (their errors have the documented form); else HTML pages
    json_api: bool
    #: the error codes this endpoint may answer beyond 401, 405
    codes: frozenset[str] = frozenset()
    #: the query parameters it reads
    params: tuple[str, ...] = ()
    #: the key of a successful answer (JSON endpoints)
    answer: str = ""


def _codes(*codes: str) -> frozenset[str]:
    return frozenset(codes)


WRITE_CODES = _codes(
    "payload_too_large",
    "csrf_failed",
    "rate_limited",
    "invalid_json",
    "invalid_message",
    "invalid_value",
)
PRESENCE_ENDPOINTS = [
    Endpoint(
        "presence",
        "/presence/api/presence",
        ("GET",),
        True,
        _codes("missing_users", "invalid_users", "too_many_users", "rate_limited"),
        ("users",),
        "presences",
    ),
    Endpoint("status", "/presence/api/status", ("POST",), True, WRITE_CODES, (), "presence"),
    # the ready settings page: HTML, so only "never a 5xx"
    Endpoint("settings page", "/presence/settings/", ("GET", "POST"), False, params=("q",)),
]
FEED_ENDPOINTS = [
    Endpoint(
        "following",
        "/presence/api/feed/following",
        ("GET",),
        True,
        _codes("invalid_cursor"),
        ("cursor",),
        "activities",
    ),
    Endpoint(
        "mentions",
        "/presence/api/feed/mentions",
        ("GET",),
        True,
        _codes("invalid_cursor"),
        ("cursor",),
        "activities",
    ),
    Endpoint(
        "user feed",
        "/presence/api/feed/user/{user}",
        ("GET",),
        True,
        _codes("unknown_user", "invalid_cursor"),
        ("cursor",),
        "activities",
    ),
    Endpoint(
        "group feed",
        "/presence/api/feed/group/{slug}",
        ("GET",),
        True,
        _codes("unknown_group", "invalid_cursor"),
        ("cursor",),
        "activities",
    ),
    *(
        Endpoint(
            f"group {action}",
            f"/presence/api/feed/group/{{slug}}/{action}",
            ("POST",),
            True,
            _codes("unknown_group", "csrf_failed", "rate_limited"),
            (),
            "group",
        )
        for action in ("join", "leave")
    ),
    Endpoint("post", "/presence/api/feed/post", ("POST",), True, WRITE_CODES, (), "activity"),
    Endpoint(
        "mention suggestions",
        "/presence/api/feed/mention-suggestions",
        ("GET",),
        True,
        _codes("invalid_value"),
        ("q",),
        "users",
    ),
]
#: the demo's pages (siteproject.demo): HTML, so only "never a 5xx"
DEMO_ENDPOINTS = [
    Endpoint("home", "/", ("GET",), False),
    Endpoint("login", "/login/", ("GET", "POST"), False, params=("next",)),
    Endpoint("logout", "/logout/", ("POST",), False),
    Endpoint("people", "/people/", ("GET",), False, params=("q",)),
    Endpoint("relation", "/people/{pk}/{action}/", ("POST",), False),
    Endpoint("profile", "/u/{username}/", ("GET",), False),
    Endpoint("old privacy page", "/settings/privacy/", ("GET",), False),
    Endpoint("old status page", "/settings/status/", ("GET", "POST"), False),
    Endpoint("feed page", "/feed/", ("GET", "POST"), False, params=("cursor",)),
    Endpoint("mentions page", "/feed/mentions/", ("GET",), False, params=("cursor",)),
    Endpoint("user feed page", "/u/{username}/activity/", ("GET",), False, params=("cursor",)),
    Endpoint("groups", "/groups/", ("GET",), False),
    Endpoint("group page", "/groups/{slug}/", ("GET",), False, params=("cursor",)),
    Endpoint("group action", "/groups/{slug}/{action}/", ("POST",), False),
    Endpoint("set language", "/i18n/setlang/", ("POST",), False, params=("next",)),
]
#: presence's admin pages (changelists with search and filters), for a superuser
ADMIN_MODELS = [
    "presence/privacysettings",
    "presence/userstatus",
    "presence/contact",
    "presence/block",
    "presence/lastseen",
]
FEED_ADMIN_MODELS = ["presence_feed/group", "presence_feed/activity"]
ADMIN_PARAMS = (
    "q",
    "o",
    "p",
    "online",
    "dnd__exact",
    "invisible__exact",
    "online_visibility__exact",
    "close_friend__exact",
    "kind__exact",
    "e",
)


def endpoints() -> list[Endpoint]:
    found = list(PRESENCE_ENDPOINTS)
    if apps.is_installed("presence.feed"):
        found += FEED_ENDPOINTS
    if apps.is_installed("siteproject.demo"):
        found += DEMO_ENDPOINTS
    models = ADMIN_MODELS + (FEED_ADMIN_MODELS if apps.is_installed("presence.feed") else [])
    found += [
        Endpoint(f"admin {model}", f"/admin/{model}/", ("GET",), False, params=ADMIN_PARAMS)
        for model in models
    ]
    return found


# --- requests ------------------------------------------------------------------------------------


def encode(text: str) -> str:
    """Percent-encoded UTF-8 (lone surrogates as the bytes they would be: not UTF-8)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


@dataclass(frozen=True)
class Request:
    endpoint: Endpoint
    method: str
    path: str
    query: str
    body: bytes | None
    content_type: str
    client: str
    extra: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        body = None if self.body is None else self.body[:200]
        return (
            f"Request({self.method} {self.path[:200]}?{self.query[:200]} as {self.client}, "
            f"{self.content_type!r}, {body!r}, {self.extra!r})"
        )


def requests(site: dict[str, Any]) -> st.SearchStrategy[Request]:
    """Requests to every endpoint: mostly with its own method, parameters and body shape, each
    fuzzed; sometimes with any method, any parameters, any body."""
    # A path segment (never "/": that would be another URL, which Django answers itself).
    segment_text = odd_text.map(lambda t: t.replace("/", "") or "x")
    user_segment = st.one_of(
        st.sampled_from(site["user_spellings"]),
        st.sampled_from(["0", "-1", "999000", "9" * 19, "9" * 40, "1.0", "1e3", " 1"]),
        st.uuids().map(str),
        segment_text,
        st.just("x" * 300),
    )
    slug_segment = st.one_of(
        st.sampled_from(["fuzz-group", "nope", "FUZZ-GROUP", "a" * 101]), segment_text
    )
    username_segment = st.one_of(
        st.sampled_from(["fuzzer", "friend", "bystander", "nobody", "FRIEND"]), segment_text
    )
    pk_segment = st.one_of(
        st.sampled_from(site["int_pks"] + ["0", "999000", "9" * 19, "9" * 30]), segment_text
    )
    action_segment = st.one_of(
        st.sampled_from([*RELATION_ACTIONS, *GROUP_ACTIONS, "x"]), segment_text
    )
    segments = {
        "user": user_segment,
        "slug": slug_segment,
        "username": username_segment,
        "pk": pk_segment,
        "action": action_segment,
    }

    good_segments = {
        "user": st.sampled_from(site["user_spellings"]),
        "slug": st.just("fuzz-group"),
        "username": st.sampled_from(["fuzzer", "friend", "bystander"]),
        "pk": st.sampled_from(site["int_pks"]),
    }

    ids_value = st.one_of(
        st.lists(st.one_of(st.sampled_from(site["user_spellings"]), user_segment), max_size=6).map(
            ",".join
        ),
        st.integers(min_value=499, max_value=502).map(
            lambda n: ",".join(str(i) for i in range(1, n + 1))
        ),
        odd_text,
    )
    value = st.one_of(
        odd_text,
        edge_ints.map(str),
        st.sampled_from(site["cursors"]),
        ids_value,
        st.just("x" * 5000),
        st.sampled_from(["", "@", "@fri", "fri", "FRI", "%", "_", "\\"]),
        st.sampled_from(["/", "//evil.example", "https://evil.example/", "/feed/"]),
    )
    pairs = st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(["users", "cursor", "q", "next", "language", *ADMIN_PARAMS]),
                odd_text,
            ),
            value,
        ),
        max_size=4,
    )

    text_field = st.one_of(
        st.none(),
        odd_text,
        st.integers(min_value=0, max_value=600).map(lambda n: "x" * n),
        st.just("Hello @friend and @bystander"),
        junk_json,
    )
    status_body = st.fixed_dictionaries(
        {},
        optional={
            "status": st.one_of(st.sampled_from(["auto", "dnd", "invisible"]), junk_json),
            "text": text_field,
            "emoji": text_field,
            "activity": text_field,
            "expires_in": st.one_of(edge_ints, st.floats(), junk_json, st.just(3600)),
        },
    )
    post_body = st.fixed_dictionaries({}, optional={"text": text_field, "extra": junk_json})
    json_body = st.builds(
        lambda value, a: dumps(value, a).encode("utf-8", "surrogatepass"),
        st.one_of(status_body, post_body, junk_json),
        st.booleans(),
    )
    form_body = pairs.map(
        lambda items: "&".join(f"{encode(k)}={encode(v)}" for k, v in items).encode()
    )
    # Demo forms with their own field names, each value fuzzed.
    demo_form = st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "username",
                    "password",
                    "text",
                    "emoji",
                    "status",
                    "expires",
                    "online_visibility",
                    "last_seen_visibility",
                    "activity_visibility",
                    "invisible",
                    "next",
                    "language",
                ]
            ),
            st.one_of(
                value,
                st.sampled_from(
                    ["dnd", "auto", "invisible", "never", "today", "30m", "everyone", "on"]
                ),
            ),
        ),
        max_size=6,
    ).map(lambda items: "&".join(f"{encode(k)}={encode(v)}" for k, v in items).encode())
    sized_body = st.builds(
        lambda limit, offset, pad: (
            b'{"text": "' + pad * ((limit + offset - 12) // len(pad)) + b'"}'
        ),
        st.sampled_from([STATUS_BODY_LIMIT, POST_BODY_LIMIT]),
        st.integers(min_value=-2, max_value=2) | st.integers(min_value=3, max_value=50_000),
        st.sampled_from([b"x", b"\\u00e9", "\u00e9".encode(), b"\\ud800"]),
    )
    deep_body = st.integers(min_value=900, max_value=50_000).map(
        lambda depth: b"[" * depth + b"]" * depth
    )
    body = st.one_of(
        st.none(),
        json_body,
        json_body,
        form_body,
        demo_form,
        demo_form,
        st.binary(max_size=64),
        sized_body,
        deep_body,
        st.sampled_from([b"", b"{", b"null", b"NaN", b"1" * 5000, b"\xff\xfe{}", b'"x"']),
    )
    extra = st.lists(
        st.one_of(
            st.tuples(st.just("HTTP_ACCEPT_LANGUAGE"), st.sampled_from(LANGUAGES)),
            # Lengths no server reads as more than the body (the test client would fail on
            # reading past it; a server would wait).
            st.tuples(st.just("CONTENT_LENGTH"), st.sampled_from(["abc", "-1", "", " 0", "1e3"])),
            st.tuples(st.just("HTTP_USER_AGENT"), st.sampled_from(["", "iPhone", "\x00"])),
            # Tokens that authenticate nobody (the "token" client has a good one).
            st.tuples(
                st.just("HTTP_AUTHORIZATION"),
                st.one_of(
                    st.sampled_from(
                        [
                            "Bearer",
                            "Bearer ",
                            "bearer x",
                            "Bearer a:b:c",
                            "Token x",
                            site["token"] + "x",
                            "Bearer " + site["token"][:-1],
                            "Bearer " + site["token"].replace(":", "::", 1),
                        ]
                    ),
                    odd_text.map(lambda text: "Bearer " + text),
                ),
            ),
        ),
        max_size=2,
        unique_by=lambda item: item[0],
    )

    # Well-formed requests of each endpoint (else few would get past the first check).
    plain_text = st.text(alphabet="ab Z9\u00e9\u4e2d\U0001f600@", max_size=30)
    good_json = {
        "status": st.fixed_dictionaries(
            {"status": st.sampled_from(["auto", "dnd", "invisible"])},
            optional={
                "text": st.one_of(st.none(), plain_text),
                "emoji": st.sampled_from([None, "\U0001f3a7"]),
                "expires_in": st.one_of(st.none(), st.integers(1, 3600)),
            },
        ),
        "post": st.builds(
            lambda text, who: {"text": f"{text} @{who}".strip()},
            plain_text,
            st.sampled_from(["friend", "bystander", "fuzzer", "nobody"]),
        ),
    }
    good_form = {
        "status page": st.builds(
            lambda status, text, expires: f"status={status}&text={encode(text)}&expires={expires}",
            st.sampled_from(["auto", "dnd", "invisible"]),
            plain_text,
            st.sampled_from(["never", "today", "30m", "1h"]),
        ),
        "privacy": st.builds(
            lambda levels, invisible: (
                "&".join(
                    f"{field}={level}"
                    for field, level in zip(
                        ["online_visibility", "last_seen_visibility", "activity_visibility"],
                        levels,
                        strict=True,
                    )
                )
                + ("&invisible=on" if invisible else "")
            ),
            st.lists(
                st.sampled_from(["everyone", "contacts", "close_friends", "nobody"]),
                min_size=3,
                max_size=3,
            ),
            st.booleans(),
        ),
        "feed page": plain_text.map(lambda text: f"text={encode(text)}"),
        "set language": st.sampled_from(["ja", "vi", "en", "zh-hans"]).map(
            lambda code: f"language={code}&next=/"
        ),
    }
    good_query = {
        "users": st.lists(
            st.one_of(st.sampled_from(site["user_spellings"]), st.just("999000")),
            min_size=1,
            max_size=5,
        ).map(",".join),
        "cursor": st.sampled_from(site["cursors"]),
        "q": st.sampled_from(["fri", "@by", "F", "fuzz", "x"]),
        "online": st.sampled_from(["1", "0"]),
        "dnd__exact": st.sampled_from(["1", "0"]),
        "o": st.sampled_from(["1", "-1", "2.1"]),
    }

    @st.composite
    def request(draw: Any) -> Request:
        endpoint = draw(st.sampled_from(site["endpoints"]))
        well_formed = draw(st.booleans())
        method = draw(
            st.sampled_from(endpoint.methods if well_formed else (*endpoint.methods, *METHODS))
        )
        path = endpoint.path
        for name in re.findall(r"\{(\w+)\}", path):
            if not well_formed:
                fitting = segments[name]
            elif name == "action":
                fitting = st.sampled_from(
                    GROUP_ACTIONS if "{slug}" in endpoint.path else RELATION_ACTIONS
                )
            else:
                fitting = good_segments[name]
            path = path.replace("{" + name + "}", encode(draw(fitting)), 1)
        query_pairs = [] if well_formed else draw(pairs)
        for param in endpoint.params:
            if well_formed and param in good_query:
                query_pairs.append((param, draw(good_query[param])))
            elif draw(st.booleans()):
                query_pairs.append((param, draw(value)))
        query = "&".join(f"{encode(k)}={encode(v)}" for k, v in query_pairs)
        if well_formed and endpoint.name in good_json:
            payload: bytes | None = json.dumps(draw(good_json[endpoint.name])).encode()
            content_type = "application/json"
        elif well_formed and endpoint.name in good_form:
            payload = draw(good_form[endpoint.name]).encode()
            content_type = "application/x-www-form-urlencoded"
        else:
            payload = draw(body) if method not in ("GET", "HEAD") or draw(st.booleans()) else None
            content_type = draw(st.sampled_from(CONTENT_TYPES))
        # The admin is for staff; the rest for the fuzzing user (by session, or by token as
        # apps do), anonymous callers, and callers whose POSTs carry no CSRF token.
        if endpoint.name.startswith("admin"):
            client = draw(st.sampled_from(["staff", "staff", "user", "anonymous"]))
        else:
            client = draw(st.sampled_from(["user", "user", "user", "anonymous", "csrf", "token"]))
        extra_headers = tuple(draw(extra))
        if client == "token":
            # Its own header: a good token of the fuzzing user.
            extra_headers = (
                *(h for h in extra_headers if h[0] != "HTTP_AUTHORIZATION"),
                ("HTTP_AUTHORIZATION", "Bearer " + site["token"]),
            )
        if payload is None or not endpoint.json_api:
            # A malformed Content-Length is refused by every HTTP server before Django sees it
            # (Django itself would fail on reading the body); presence's endpoints check it
            # themselves all the same.
            extra_headers = tuple(h for h in extra_headers if h[0] != "CONTENT_LENGTH")
        return Request(endpoint, method, path, query, payload, content_type, client, extra_headers)

    return request()


# --- checking the answers ----------------------------------------------------------------------


def check_json_answer(request: Request, response: Any) -> None:
    """presence's JSON endpoints: JSON always; errors in the documented form, code and status;
    405 before 401 before anything else."""
    endpoint = request.endpoint
    if request.method == "HEAD":
        return  # no body to read
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    body = json.loads(response.content)
    if request.method not in endpoint.methods:
        assert response.status_code == 405, body
        assert response["Allow"] == ", ".join(endpoint.methods)
    elif request.client == "anonymous":  # (a bad token leaves a caller anonymous)
        assert response.status_code == 401, body
    if response.status_code >= 400:
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
        code, message = body["error"]["code"], body["error"]["message"]
        assert code in endpoint.codes | {"not_authenticated", "method_not_allowed"}, body
        assert ERROR_STATUS[code] == response.status_code, body
        assert isinstance(message, str) and message, body
        if code == "rate_limited":
            assert response["Retry-After"].isdigit(), response["Retry-After"]
    else:
        assert response.status_code == (201 if endpoint.name == "post" else 200), body
        assert isinstance(body, dict) and endpoint.answer in body, body


def send(clients: dict[str, Client], request: Request) -> Any:
    return clients[request.client].generic(
        request.method,
        request.path + ("?" + request.query if request.query else ""),
        data=request.body or b"",
        content_type=request.content_type,
        **dict(request.extra),
    )


# --- other users' state -------------------------------------------------------------------------


def _rows(queryset: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(row.items())) for row in queryset.values())


def others_rows(actors: list[Any]) -> dict[str, Any]:
    """Every presence and feed row except those the fuzzing users own (each may change its
    own): their status, privacy and last seen, their contacts and blocks, their memberships
    and posts, their user rows (last login)."""
    rows = {
        "UserStatus": _rows(UserStatus.objects.exclude(user__in=actors)),
        "PrivacySettings": _rows(PrivacySettings.objects.exclude(user__in=actors)),
        "LastSeen": _rows(LastSeen.objects.exclude(user__in=actors)),
        "Contact": _rows(Contact.objects.exclude(owner__in=actors)),
        "Block": _rows(Block.objects.exclude(blocker__in=actors)),
        "users": _rows(get_user_model()._default_manager.exclude(pk__in=[u.pk for u in actors])),
    }
    if apps.is_installed("presence.feed"):
        from presence.feed.models import Activity, Group, Membership, Mention

        rows["Group"] = _rows(Group.objects.all())
        rows["Membership"] = _rows(Membership.objects.exclude(user__in=actors))
        rows["Activity"] = _rows(Activity.objects.exclude(author__in=actors))
        rows["Mention"] = _rows(Mention.objects.exclude(activity__author__in=actors))
    return rows


# --- the fuzz -----------------------------------------------------------------------------------


def _site(make_user: Callable[..., Any]) -> tuple[Any, Any, Any, Any]:
    fuzzer = make_user("fuzzer")
    friend = make_user("friend")
    bystander = make_user("bystander")
    staff = make_user("staff", is_staff=True, is_superuser=True)
    Contact.objects.create(owner=fuzzer, contact=friend)
    Contact.objects.create(owner=friend, contact=fuzzer, close_friend=True)
    Contact.objects.create(owner=bystander, contact=friend)
    Block.objects.create(blocker=bystander, blocked=fuzzer)
    PrivacySettings.objects.create(user=friend, last_seen_visibility="nobody")
    api.set_status(friend, "dnd", text="Friend's own status", emoji="\U0001f3a7")
    api.set_status(bystander, "invisible", text="Bystander's")
    api.touch(bystander, "mobile")
    if apps.is_installed("presence.feed"):
        from presence.feed import api as feed
        from presence.feed.models import Group

        group = Group.objects.create(name="Fuzz", slug="fuzz-group")
        feed.join(friend, group)
        feed.join(bystander, group)
        feed.post(friend, "Hello @fuzzer and @bystander")
        feed.post(bystander, "Unrelated")
    return fuzzer, friend, bystander, staff


def _cursors() -> list[str]:
    """Cursors of real positions and of none, the kind a client passes back."""
    if not apps.is_installed("presence.feed"):
        return ["x"]
    from datetime import UTC, datetime

    from presence.feed.domain import Position, encode_cursor

    moments = [datetime(2030, 1, 7, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)]
    return [encode_cursor(Position(when, pk)) for when in moments for pk in (1, 2**63 - 1)] + [
        "MTIzLjQ1",  # "123.45": a cursor's form, an activity of no one
        "AAAA",
        "====",
    ]


def test_fuzzed_requests_never_fail_and_change_no_other_user(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    fuzzer, friend, bystander, staff = _site(make_user)
    spellings = []
    for user in (fuzzer, friend, bystander):
        pk = user.pk
        spellings += [str(pk), f"0{pk}"] if isinstance(pk, int) else [str(pk), str(pk).upper()]
    site = {
        "endpoints": endpoints(),
        "user_spellings": spellings,
        "int_pks": [str(u.pk) for u in (fuzzer, friend, bystander)],
        "cursors": _cursors(),
        "token": issue_token(fuzzer),
    }
    # The fuzzing user (by session or token), and the superuser who reads the admin pages:
    # each may change itself.
    actors = [fuzzer, staff]
    rows_before = others_rows(actors)
    redis_before = redis_of_others(redis_client, actors)
    statuses: Counter[tuple[str, str]] = Counter()
    counted = {"requests": 0}
    failures: list[BaseException] = []

    # Apps' tokens too (docs/websocket.md, "Native and mobile clients").
    middleware = list(django_settings.MIDDLEWARE)
    middleware.insert(
        middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
        "presence.tokens.TokenAuthenticationMiddleware",
    )

    def client(kind: str) -> Client:
        made = Client(enforce_csrf_checks=kind == "csrf", raise_request_exception=True)
        if kind in ("user", "csrf"):
            quiet_login(made, fuzzer)
        elif kind == "staff":
            quiet_login(made, staff)
        return made

    @seed(SEED)
    @settings(
        max_examples=REQUESTS_PER_RUN // REQUESTS_PER_EXAMPLE,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.lists(requests(site), min_size=REQUESTS_PER_EXAMPLE, max_size=REQUESTS_PER_EXAMPLE),
        st.booleans(),
    )
    def fuzz_requests(batch: list[Request], rate_limited: bool) -> None:
        # Hypothesis runs a failing example again to report it; by then the database has moved
        # on, so the first failure is what it reports.
        if failures:
            raise failures[0]
        try:
            fuzz_batch(batch, rate_limited)
        except BaseException as failure:
            failures.append(failure)
            raise

    def fuzz_batch(batch: list[Request], rate_limited: bool) -> None:
        # Each batch with fresh clients (a logout must not end the next batch's session); half
        # the batches under a low HTTP_RATE_LIMIT and HTTP_READ_LIMIT (the clock stands still:
        # once past them, every write or presence read of the run is refused), half with none
        # (so that writes and reads get past them).
        clients = {kind: client(kind) for kind in ("user", "csrf", "anonymous", "staff", "token")}
        limit = {
            "HTTP_RATE_LIMIT": (3, 60) if rate_limited else None,
            "HTTP_READ_LIMIT": (100, 60) if rate_limited else None,
        }
        with override_settings(PRESENCE=limit, MIDDLEWARE=middleware):
            for request in batch:
                response = send(clients, request)
                assert response.status_code < 500, (request, response.content[:500])
                answer = str(response.status_code)
                if (
                    request.endpoint.json_api
                    and response.status_code >= 400
                    and request.method != "HEAD"
                ):
                    answer += " " + json.loads(response.content)["error"]["code"]
                statuses[(request.endpoint.name, answer)] += 1
                if request.endpoint.json_api:
                    try:
                        check_json_answer(request, response)
                    except AssertionError as failure:
                        raise AssertionError(f"{request!r}: {failure}") from failure
                # presence's own errors, and Django's record of a 5xx; django.security's
                # records of the requests it refuses itself (400) are its design, not a failure.
                errors = [
                    r
                    for r in caplog.records
                    if r.levelno >= logging.ERROR
                    and (r.name.startswith("presence") or r.name == "django.request")
                ]
                assert errors == [], (request, [r.getMessage() for r in errors])
                counted["requests"] += 1
        assert others_rows(actors) == rows_before
        assert redis_of_others(redis_client, actors) == redis_before

    fuzz_requests()
    assert counted["requests"] >= REQUESTS_PER_RUN
    print(f"\n{counted['requests']} fuzzed requests:")
    for (name, answer), count in sorted(statuses.items()):
        print(f"  {name}: {answer} x{count}")
    # Every endpoint was answered (the JSON ones both ways), and the rate limit was reached.
    for endpoint in site["endpoints"]:
        answers = {answer for (name, answer) in statuses if name == endpoint.name}
        assert any(a[0] in "23" for a in answers), (endpoint.name, answers)
        assert any(a[0] == "4" for a in answers) or not endpoint.json_api, (endpoint.name, answers)
    assert any(answer == "429 rate_limited" for (_, answer) in statuses)
