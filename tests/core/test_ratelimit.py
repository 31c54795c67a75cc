"""HTTP_RATE_LIMIT (presence.ratelimit): a per-user limit on HTTP writes, shared through Redis,
answered with 429 ``rate_limited`` and Retry-After, failing open when Redis is down."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.test import Client

from presence import store as store_module
from presence.feed.models import Activity, Group
from presence.models import UserStatus

pytestmark = pytest.mark.django_db

STATUS = "/presence/api/status"
POST = "/presence/api/feed/post"
#: the settings page, where the demo's Status leads (a form post, HTML)
SETTINGS = "/presence/settings/"


def _json(client: Client, url: str, data: Any, **headers: Any) -> Any:
    return client.post(url, json.dumps(data), content_type="application/json", **headers)


def _assert_rate_limited(response: Any, retry_after: int) -> None:
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"]["code"] == "rate_limited" and body["error"]["message"]
    assert response["Retry-After"] == str(retry_after)


@pytest.fixture
def limited(settings: Any) -> None:
    # 2 writes per minute; the clock fixture starts on a whole minute (tests.clock.T0).
    settings.PRESENCE = {"HTTP_RATE_LIMIT": (2, 60)}


@pytest.fixture
def client(clock: time_machine.Coordinates, make_user: Callable[..., Any]) -> Client:
    # Logged in after the clock stopped, so the session is fresh at the test's time.
    client = Client()
    client.force_login(make_user())
    return client


def status_write(client: Client, n: int) -> Any:
    return _json(client, STATUS, {"status": "auto", "text": f"status {n}"})


def post_write(client: Client, n: int) -> Any:
    return _json(client, POST, {"text": f"post {n}"})


def join_leave_write(client: Client, n: int) -> Any:
    Group.objects.get_or_create(slug="g", defaults={"name": "G"})
    return client.post(f"/presence/api/feed/group/g/{'join' if n % 2 == 0 else 'leave'}")


WRITES = {"status": status_write, "feed-post": post_write, "join-leave": join_leave_write}


@pytest.mark.usefixtures("limited")
@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (STATUS, {"status": "busy"}),
        (STATUS, {"status": "auto", "expires_in": 0}),
        (POST, {"txt": "a typo"}),
        (POST, {"text": 5}),
        (POST, {"text": ""}),
        (POST, {"text": None}),
        (POST, ["not", "an", "object"]),
    ],
)
def test_refused_input_saves_nothing_and_is_not_counted_as_a_write(
    client: Client, path: str, bad: Any
) -> None:
    for _ in range(3):
        assert _json(client, path, bad).status_code == 400
    assert status_write(client, 0).status_code == 200
    assert post_write(client, 1).status_code == 201
    _assert_rate_limited(status_write(client, 2), retry_after=60)


@pytest.mark.usefixtures("limited")
@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_past_the_limit_answers_429_with_retry_after_until_the_window_ends(
    client: Client, clock: time_machine.Coordinates, write: Callable[[Client, int], Any]
) -> None:
    assert write(client, 0).status_code in (200, 201)
    clock.shift(10)
    assert write(client, 1).status_code in (200, 201)
    clock.shift(5)
    _assert_rate_limited(write(client, 2), retry_after=45)
    clock.shift(44)
    _assert_rate_limited(write(client, 3), retry_after=1)
    clock.shift(1)  # a new window
    assert write(client, 4).status_code in (200, 201)


@pytest.mark.usefixtures("limited")
def test_a_refused_write_changes_nothing_and_other_users_are_not_limited(
    client: Client, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # One count for all of a user's HTTP writes.
    assert status_write(client, 0).status_code == 200
    assert post_write(client, 1).status_code == 201
    _assert_rate_limited(status_write(client, 9), retry_after=60)
    _assert_rate_limited(post_write(client, 9), retry_after=60)
    assert UserStatus.objects.get().text == "status 0"
    assert list(Activity.objects.values_list("text", flat=True)) == ["post 1"]
    other = Client()
    other.force_login(make_user())
    assert status_write(other, 0).status_code == 200


@pytest.mark.usefixtures("limited")
def test_the_count_is_shared_across_processes(
    client: Client, clock: time_machine.Coordinates
) -> None:
    # Each process has its own store (clients); the counter lives in Redis.
    assert status_write(client, 0).status_code == 200
    store_module.reset_clients()
    assert post_write(client, 1).status_code == 201
    store_module.reset_clients()
    _assert_rate_limited(status_write(client, 2), retry_after=60)


@pytest.mark.usefixtures("limited")
def test_the_429_message_counts_the_seconds_in_the_callers_language(
    client: Client, clock: time_machine.Coordinates
) -> None:
    assert status_write(client, 0).status_code == 200
    assert status_write(client, 1).status_code == 200
    clock.shift(59)
    refused = status_write(client, 2)
    assert refused["Retry-After"] == "1"
    assert refused.json()["error"]["message"].endswith("try again in 1 second.")
    refused = _json(client, STATUS, {"status": "dnd"}, HTTP_ACCEPT_LANGUAGE="ja")
    assert refused.json()["error"]["message"] == (
        "短時間に変更が多すぎます。1 秒後にもう一度お試しください。"
    )
    form = {"status": "dnd", "emoji": "", "text": "busy", "expires": "never"}
    assert "try again in 1 second." in client.post(SETTINGS, form).content.decode()


@pytest.mark.usefixtures("limited")
def test_demo_forms_answer_429_with_the_error_on_the_page(
    client: Client, clock: time_machine.Coordinates
) -> None:
    form = {"status": "dnd", "emoji": "", "text": "busy", "expires": "never"}
    assert client.post(SETTINGS, form).status_code == 302
    assert client.post("/feed/", {"text": "hello"}).status_code == 302
    refused = client.post(SETTINGS, {**form, "text": "again"})
    assert refused.status_code == 429 and refused["Retry-After"] == "60"
    assert "try again in 60 seconds" in refused.content.decode()
    refused = client.post("/feed/", {"text": "again"})
    assert refused.status_code == 429 and "try again in 60 seconds" in refused.content.decode()
    assert UserStatus.objects.get().text == "busy"
    assert list(Activity.objects.values_list("text", flat=True)) == ["hello"]


def test_none_turns_the_limit_off(
    settings: Any, client: Client, clock: time_machine.Coordinates
) -> None:
    settings.PRESENCE = {"HTTP_RATE_LIMIT": None}
    for n in range(5):
        assert status_write(client, n).status_code == 200


def test_the_default_allows_30_writes_a_minute(
    client: Client, clock: time_machine.Coordinates
) -> None:
    for n in range(30):
        assert post_write(client, n).status_code == 201
    _assert_rate_limited(post_write(client, 30), retry_after=60)


@pytest.mark.usefixtures("limited")
def test_fails_open_when_redis_is_down(
    private_redis: Any, client: Client, clock: time_machine.Coordinates
) -> None:
    private_redis.stop()
    for n in range(4):
        assert post_write(client, n).status_code == 201
    assert Activity.objects.count() == 4


def _docs_button_recipe() -> dict[str, Any]:
    """The Block button of docs/api.md ("The write limit on a site's own buttons"), run as
    printed; its redirect to the site's profile page stands in as a plain 302."""
    import re
    from pathlib import Path

    from django.contrib.auth import get_user_model
    from django.http import HttpResponse, HttpResponseRedirect
    from django.shortcuts import get_object_or_404
    from django.views.decorators.http import require_POST

    from presence import api

    page = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = page.split("## The write limit on a site's own buttons", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: dict[str, Any] = {
        "HttpResponse": HttpResponse,
        "require_POST": require_POST,
        "get_object_or_404": get_object_or_404,
        "User": get_user_model(),
        "api": api,
        "redirect": lambda *args, **kwargs: HttpResponseRedirect("/profile/"),
    }
    exec(compile(code.group(1), "<docs/api.md>", "exec"), namespace)
    return namespace


def test_the_docs_block_button_counts_its_writes(
    limited: None, clock: time_machine.Coordinates, make_user: Callable[..., Any]
) -> None:
    from django.test import RequestFactory

    from presence.models import Block

    block = _docs_button_recipe()["block"]
    user, other = make_user(), make_user()

    def press() -> Any:
        request = RequestFactory().post("/block/")
        request.user = user
        return block(request, other.username)

    assert press().status_code == 302
    assert press().status_code == 302  # (2 writes a minute)
    refused = press()
    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"  # the clock stands at the start of a window
    assert refused.content.decode() == (
        "Too many changes in a short time; try again in 60 seconds."
    )
    assert Block.objects.filter(blocker=user, blocked=other).count() == 1
