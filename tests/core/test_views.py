"""The JSON endpoints: the privacy matrix through HTTP, login, CSRF, methods and bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings
from django.urls import reverse
from django.utils.crypto import get_random_string

from presence import api
from presence.models import Contact, LastSeen, PrivacySettings, UserStatus
from tests.ids import missing_id
from tests.privacy_cases import (
    CASE_IDS,
    CASES,
    NOW,
    Case,
    build,
    count_round_trips,
    expected,
    quiet_login,
)

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]

PRESENCE_URL = "/presence/api/presence"
STATUS_URL = "/presence/api/status"
UNKNOWN_ID = missing_id()


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def _post(client: Client, data: Any, **extra: Any) -> Any:
    body = data if isinstance(data, str | bytes) else json.dumps(data)
    return client.post(STATUS_URL, body, content_type="application/json", **extra)


def test_urls_are_named() -> None:
    assert reverse("presence:presence") == PRESENCE_URL
    assert reverse("presence:status") == STATUS_URL


# --- the privacy matrix through GET ---------------------------------------------------------


@pytest.mark.privacy_matrix
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_privacy_matrix(case: Case, make_user: Callable[..., Any]) -> None:
    client = Client()
    with time_machine.travel(NOW, tick=False):
        scenario = build(case, make_user)
        target = scenario.target
        if scenario.viewer is None:
            _error(client.get(PRESENCE_URL, {"users": target.pk}), 401, "not_authenticated")
            return
        quiet_login(client, scenario.viewer)
        response = client.get(PRESENCE_URL, {"users": f"{target.pk},{UNKNOWN_ID}"})
    assert response.status_code == 200
    assert response.json() == {"presences": {str(target.pk): expected(case).as_json()}}


# --- login ----------------------------------------------------------------------------------


def test_anonymous_get_is_401_json_not_a_redirect(make_user: Callable[..., Any]) -> None:
    target = make_user()
    response = Client().get(PRESENCE_URL, {"users": target.pk})
    _error(response, 401, "not_authenticated")
    assert not response.has_header("Location")


@pytest.mark.parametrize("enforce_csrf", [False, True])
def test_anonymous_post_is_401_json(enforce_csrf: bool) -> None:
    response = _post(Client(enforce_csrf_checks=enforce_csrf), {"status": "dnd"})
    _error(response, 401, "not_authenticated")
    assert not response.has_header("Location")
    assert not UserStatus.objects.exists()


def test_inactive_session_user_is_anonymous(make_user: Callable[..., Any]) -> None:
    user = make_user()
    client = Client()
    client.force_login(user)
    user.is_active = False
    user.save()
    _error(client.get(PRESENCE_URL, {"users": user.pk}), 401, "not_authenticated")


# --- GET: input -----------------------------------------------------------------------------


@pytest.fixture
def viewer_client(make_user: Callable[..., Any]) -> tuple[Client, Any]:
    viewer = make_user()
    client = Client()
    client.force_login(viewer)
    return client, viewer


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({}, "missing_users"),
        ({"users": ""}, "missing_users"),
        ({"users": " , ,"}, "missing_users"),
        ({"users": "1,a"}, "invalid_users"),
        ({"users": "-1"}, "invalid_users"),
        ({"users": "1.5"}, "invalid_users"),
        ({"users": "0x10"}, "invalid_users"),
        ({"users": "²"}, "invalid_users"),
        ({"users": "1" * 20}, "invalid_users"),
        ({"users": str(2**63)}, "invalid_users"),
        ({"users": ",".join(str(i) for i in range(1, 502))}, "too_many_users"),
    ],
    ids=[
        "absent",
        "empty",
        "only-commas",
        "letter",
        "negative",
        "decimal",
        "hex",
        "superscript",
        "too-long-id",
        "past-the-largest-id",
        "501-ids",
    ],
)
def test_get_bad_input_is_400(
    query: dict[str, str], code: str, viewer_client: tuple[Client, Any]
) -> None:
    client, _ = viewer_client
    _error(client.get(PRESENCE_URL, query), 400, code)


def test_get_exactly_500_ids_is_fine_and_costs_two_round_trips(
    viewer_client: tuple[Client, Any], make_user: Callable[..., Any]
) -> None:
    client, viewer = viewer_client
    friend = make_user()
    Contact.objects.create(owner=friend, contact=viewer)
    api.touch(friend)
    ids = [friend.pk] + [missing_id(i) for i in range(499)]
    client.get(PRESENCE_URL, {"users": friend.pk})  # the middleware's touch happens here
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        response = client.get(PRESENCE_URL, {"users": ",".join(map(str, ids))})
    assert response.status_code == 200
    # Unknown ids are left out.
    assert list(response.json()["presences"]) == [str(friend.pk)]
    assert response.json()["presences"][str(friend.pk)]["status"] == "online"
    assert trips.count == 2  # the read budget (HTTP_READ_LIMIT), then every presence at once
    # session, user, then one query for every target's privacy facts
    assert len(queries) == 3


def test_get_tolerates_spaces_and_duplicates(
    viewer_client: tuple[Client, Any], make_user: Callable[..., Any]
) -> None:
    client, viewer = viewer_client
    target = make_user()
    response = client.get(PRESENCE_URL, {"users": f" {target.pk} ,{target.pk},{viewer.pk}"})
    assert response.status_code == 200
    assert set(response.json()["presences"]) == {str(target.pk), str(viewer.pk)}


def test_answers_are_not_cached(viewer_client: tuple[Client, Any]) -> None:
    client, viewer = viewer_client
    response = client.get(PRESENCE_URL, {"users": viewer.pk})
    assert "no-store" in response["Cache-Control"]
    assert "private" in response["Cache-Control"]


# --- methods --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "allow"),
    [
        ("post", PRESENCE_URL, "GET"),
        ("put", PRESENCE_URL, "GET"),
        ("delete", PRESENCE_URL, "GET"),
        ("get", STATUS_URL, "POST"),
        ("put", STATUS_URL, "POST"),
        ("patch", STATUS_URL, "POST"),
        ("delete", STATUS_URL, "POST"),
    ],
)
def test_wrong_method_is_405_json(
    method: str, url: str, allow: str, viewer_client: tuple[Client, Any]
) -> None:
    client, _ = viewer_client
    response = getattr(client, method)(url)
    _error(response, 405, "method_not_allowed")
    assert response["Allow"] == allow


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_wrong_method_without_a_csrf_token_is_405_json_too(
    method: str, make_user: Callable[..., Any]
) -> None:
    """A browser's session and no CSRF token: the GET-only endpoint still answers 405 in JSON,
    not Django's HTML 403 page (found by tests/core/test_fuzz_http.py)."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user())
    response = getattr(client, method)(PRESENCE_URL)
    _error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET"


# --- POST: setting a status -----------------------------------------------------------------


def test_post_sets_status_and_answers_own_presence(
    make_user: Callable[..., Any],
) -> None:
    user, contact = make_user(), make_user()
    Contact.objects.create(owner=user, contact=contact)
    client = Client()
    with time_machine.travel(NOW, tick=False):
        client.force_login(user)  # logging in records activity: the user is online
        response = _post(
            client, {"status": "dnd", "text": " Focus ", "emoji": "🎯", "expires_in": 3600}
        )
        assert response.status_code == 200
        own = {
            "status": "dnd",
            "last_seen": NOW.isoformat(),
            "last_seen_approx": None,
            "devices": ["web"],
            "text": "Focus",
            "emoji": "🎯",
            "activity": None,
            "invisible": False,
            "expires_at": (NOW + timedelta(hours=1)).isoformat(),  # in one's own only
        }
        assert response.json() == {"presence": own}
        # The same shape as the user's own entry from GET.
        listed = client.get(PRESENCE_URL, {"users": user.pk}).json()["presences"]
        assert listed == {str(user.pk): own}
        assert api.get_presence(user, contact).status == "dnd"

    status = UserStatus.objects.get(user=user)
    assert (status.dnd, status.text, status.emoji, status.activity) == (True, "Focus", "🎯", "")
    assert status.expires_at == NOW + timedelta(hours=1)


def test_post_invisible_then_auto(make_user: Callable[..., Any]) -> None:
    user, contact = make_user(), make_user()
    Contact.objects.create(owner=user, contact=contact)
    client = Client()
    client.force_login(user)
    response = _post(client, {"status": "invisible", "activity": "Reading"})
    assert response.json()["presence"]["status"] == "online"
    assert response.json()["presence"]["invisible"] is True
    assert PrivacySettings.objects.get(user=user).invisible is True
    as_contact = api.get_presence(user, contact)
    assert (as_contact.status, as_contact.last_seen) == ("offline", None)

    response = _post(client, {"status": "auto", "expires_in": None})
    assert response.json()["presence"]["invisible"] is False
    assert response.json()["presence"]["activity"] is None
    assert api.get_presence(user, contact).status == "online"


def test_post_accepts_fractional_expiry(viewer_client: tuple[Client, Any]) -> None:
    client, viewer = viewer_client
    with time_machine.travel(NOW, tick=False):
        assert _post(client, {"status": "auto", "text": "x", "expires_in": 90.5}).status_code == 200
    assert UserStatus.objects.get(user=viewer).expires_at == NOW + timedelta(seconds=90)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("{not json", "invalid_json"),
        ("", "invalid_json"),
        (b"\xff\xfe{}", "invalid_json"),
        ("[" * 2000 + "]" * 2000, "invalid_json"),  # deeper than Python recurses
        ([], "invalid_message"),
        ("null", "invalid_message"),
        ('"dnd"', "invalid_message"),
        ({}, "invalid_message"),
        ({"text": "hi"}, "invalid_message"),
        ({"status": 1}, "invalid_message"),
        ({"status": "busy"}, "invalid_value"),
        ({"status": "offline"}, "invalid_value"),
        ({"status": "dnd", "text": 5}, "invalid_message"),
        ({"status": "dnd", "emoji": ["🙂"]}, "invalid_message"),
        ({"status": "dnd", "activity": {"a": 1}}, "invalid_message"),
        ({"status": "dnd", "expires_in": "60"}, "invalid_message"),
        ({"status": "dnd", "expires_in": True}, "invalid_message"),
        ({"status": "dnd", "text": "x" * 141}, "invalid_value"),
        ({"status": "dnd", "emoji": "🙂" * 17}, "invalid_value"),
        ({"status": "dnd", "text": "tab\there"}, "invalid_value"),
        ({"status": "dnd", "expires_in": 0}, "invalid_value"),
        ({"status": "dnd", "expires_in": -5}, "invalid_value"),
        ({"status": "dnd", "expires_in": 0.5}, "invalid_value"),
        ({"status": "dnd", "expires_in": 31 * 24 * 3600}, "invalid_value"),
        ('{"status": "dnd", "expires_in": NaN}', "invalid_value"),
        ({"status": "dnd", "text": "x" * 5000}, "payload_too_large"),
    ],
)
def test_post_bad_input_is_400_and_saves_nothing(
    body: Any, code: str, viewer_client: tuple[Client, Any]
) -> None:
    client, viewer = viewer_client
    _error(_post(client, body), 400, code)
    assert not UserStatus.objects.filter(user=viewer).exists()
    assert not PrivacySettings.objects.filter(user=viewer).exists()


def test_post_text_at_the_limit_is_fine(viewer_client: tuple[Client, Any]) -> None:
    client, _ = viewer_client
    response = _post(client, {"status": "auto", "text": "é" * 140, "emoji": "🙂" * 16})
    assert response.status_code == 200
    assert response.json()["presence"]["text"] == "é" * 140


def test_post_body_size_limit(viewer_client: tuple[Client, Any]) -> None:
    client, _ = viewer_client
    padding = 4096 - len(json.dumps({"status": "auto", "pad": ""}))
    fits = json.dumps({"status": "auto", "pad": "x" * padding})
    assert len(fits) == 4096
    assert _post(client, fits).status_code == 200
    _error(_post(client, fits + " "), 400, "payload_too_large")


# --- CSRF -----------------------------------------------------------------------------------


def test_post_enforces_csrf(make_user: Callable[..., Any]) -> None:
    user = make_user()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    _error(_post(client, {"status": "dnd"}), 403, "csrf_failed")
    secret = get_random_string(32)
    client.cookies["csrftoken"] = secret
    _error(_post(client, {"status": "dnd"}), 403, "csrf_failed")  # cookie but no header
    _error(_post(client, {"status": "dnd"}, HTTP_X_CSRFTOKEN="x" * 32), 403, "csrf_failed")
    assert not UserStatus.objects.filter(user=user).exists()

    response = _post(client, {"status": "dnd"}, HTTP_X_CSRFTOKEN=secret)
    assert response.status_code == 200
    assert UserStatus.objects.get(user=user).dnd is True


def test_get_needs_no_csrf_token(make_user: Callable[..., Any]) -> None:
    user = make_user()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get(PRESENCE_URL, {"users": user.pk}).status_code == 200


# --- language -------------------------------------------------------------------------------


def test_error_messages_follow_the_language_codes_do_not(
    viewer_client: tuple[Client, Any],
) -> None:
    anonymous = Client().get(PRESENCE_URL, {"users": "1"}, HTTP_ACCEPT_LANGUAGE="ja")
    assert _error(anonymous, 401, "not_authenticated")["message"] == (
        "プレゼンスを見るにはログインしてください。"
    )
    client, viewer = viewer_client
    bad = client.get(PRESENCE_URL, {"users": f"{viewer.pk},x"}, HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert _error(bad, 400, "invalid_users")["message"] == "'x' 不是有效的用户 ID。"
    missing = client.get(PRESENCE_URL, HTTP_ACCEPT_LANGUAGE="vi")
    assert _error(missing, 400, "missing_users")["message"] == (
        "Hãy truyền ID người dùng theo dạng ?users=1,2,3."
    )


# --- Redis outage ---------------------------------------------------------------------------

DOWN = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",
    }
}


def test_get_during_a_redis_outage_shows_persisted_last_seen(
    make_user: Callable[..., Any],
) -> None:
    viewer, target = make_user(), make_user()
    Contact.objects.create(owner=target, contact=viewer)
    LastSeen.objects.create(user=target, seen_at=NOW - timedelta(hours=5))
    api.touch(target)  # online in the real Redis, which is out of reach below
    client = Client()
    with override_settings(CACHES=DOWN), time_machine.travel(NOW, tick=False):
        client.force_login(viewer)  # the login's touch fails open
        response = client.get(PRESENCE_URL, {"users": target.pk})
        assert response.status_code == 200
        assert response.json()["presences"][str(target.pk)] == {
            "status": "offline",
            "last_seen": (NOW - timedelta(hours=5)).isoformat(),
            "last_seen_approx": None,
            "devices": [],
            "text": None,
            "emoji": None,
            "activity": None,
        }
        # Choices live in the database: setting a status still works.
        assert _post(client, {"status": "dnd"}).status_code == 200
    assert UserStatus.objects.get(user=viewer).dnd is True


# --- text the database cannot store, or that misleads readers -------------------------------

#: lone surrogates (UnicodeEncodeError in every database), NUL (PostgreSQL refuses it), an
#: invisible control (RIGHT-TO-LEFT OVERRIDE)
UNSTORABLE = {"surrogate": "hi \ud800", "nul": "a\x00b", "rlo": "x\u202ey"}


@pytest.mark.parametrize("field", ["text", "emoji", "activity"])
@pytest.mark.parametrize("bad", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_status_with_unstorable_text_is_400_and_saves_nothing(
    make_user: Callable[..., Any], field: str, bad: str
) -> None:
    client = Client()
    client.force_login(make_user())
    response = _post(client, {"status": "dnd", field: bad})
    assert f"'{field}'" in _error(response, 400, "invalid_value")["message"]
    assert not UserStatus.objects.exists()
    assert not PrivacySettings.objects.exists()
