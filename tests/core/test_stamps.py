"""The page's stamp (presence.stamps): every dot a request renders for a signed-in viewer
carries it; it proves the time of the request's first read to that viewer only."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import redis
import time_machine
from django.contrib.auth.models import AnonymousUser
from django.template import RequestContext, Template
from django.test import RequestFactory, override_settings

from presence import api, stamps
from presence.store import get_store
from tests.clock import T0
from tests.conftest import UNREACHABLE

pytestmark = pytest.mark.django_db

DOTS = Template("{% load presence %}{% presence_dot a %}{% presence_dot b %}")
DOWN = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": UNREACHABLE,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.1, "SOCKET_TIMEOUT": 0.1},
    }
}


def dots(viewer: Any, a: Any, b: Any) -> list[str]:
    request = RequestFactory().get("/")
    request.user = viewer
    html = DOTS.render(RequestContext(request, {"a": a, "b": b}))
    assert html.count("presence-dot--") == 2
    return re.findall(r'data-presence-since="([^"]+)"', html)


def test_every_dot_carries_the_stamp_of_the_requests_first_read(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, a, b = make_user(), make_user(), make_user()
    found = dots(viewer, a, b)
    assert len(found) == 2 and found[0] == found[1]
    assert stamps.accepted_time(found[0], viewer.pk) == T0.timestamp()
    assert stamps.accepted_time(found[0], a.pk) is None  # another viewer's: proves nothing


def test_an_anonymous_viewers_dots_carry_no_stamp(make_user: Callable[..., Any]) -> None:
    assert dots(AnonymousUser(), make_user(), make_user()) == []


def test_dots_read_while_redis_is_down_carry_no_stamp(make_user: Callable[..., Any]) -> None:
    viewer, a, b = make_user(), make_user(), make_user()
    with override_settings(CACHES=DOWN):
        assert dots(viewer, a, b) == []


def test_dots_read_while_redis_is_too_slow_for_the_page_carry_no_stamp(
    make_user: Callable[..., Any], private_redis: Any, settings: Any
) -> None:
    # Late replies are not an outage (the store stays up), but the page shows the database's
    # guess all the same: a stamp would make a stamped subscribe call it unchanged.
    settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1}
    viewer, a, b = make_user(), make_user(), make_user()
    api.touch(a)
    client = redis.Redis.from_url(private_redis.url)
    client.client_pause(1000)
    try:
        assert dots(viewer, a, b) == []
        assert not get_store().known_down()
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
        client.close()
    assert len(dots(viewer, a, b)) == 2  # answered in time again: stamped


def test_a_stamp_is_accepted_within_resume_window_and_the_same_utc_day() -> None:
    now = T0.timestamp()
    stamp = stamps.mint(7, now - 30)
    assert stamps.accepted_time(stamp, 7, now) == now - 30
    assert stamps.accepted_time(stamp, 7, now + 270) == now - 30  # RESUME_WINDOW: 300 s
    assert stamps.accepted_time(stamp, 7, now + 271) is None  # older than RESUME_WINDOW
    assert stamps.accepted_time(stamps.mint(7, now + 3), 7, now) is None  # from the future
    midnight = (now // 86400 + 1) * 86400
    assert stamps.accepted_time(stamps.mint(7, midnight - 10), 7, midnight + 10) is None
    # Within STAMP_SLACK of midnight the clocks may disagree on the day.
    assert stamps.accepted_time(stamps.mint(7, midnight + 1), 7, midnight + 10) is None
    assert stamps.accepted_time(stamps.mint(7, midnight + 5), 7, midnight + 10) == midnight + 5


@pytest.mark.parametrize(
    "garbled", ["1.\ud800", "1.é", "", ".", "x.y", "1" * 17 + ".abc", "١٢.abc"]
)
def test_a_garbled_stamp_proves_nothing_and_never_raises(garbled: str) -> None:
    now = T0.timestamp()
    assert stamps.accepted_time(garbled, 7, now) is None
    real = stamps.mint(7, now - 1)
    assert stamps.accepted_time(real[:-1] + "\ud800", 7, now) is None
