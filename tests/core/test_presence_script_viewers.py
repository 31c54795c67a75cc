"""{% presence_script %} by viewer (issue 29): nothing for an anonymous visitor, whose socket
the server would refuse (4401, the client's "unauthorized"), the script for a logged-in user,
with their id (``presence.self``: a page's script leaves the viewer out of a room's members),
found however deep the tag is rendered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import AnonymousUser
from django.template import RequestContext, Template
from django.test import Client, RequestFactory
from django.urls import reverse

from tests.core.test_templatetags import WORDS_EN, quoted

pytestmark = pytest.mark.django_db

LABELS = (
    "{&quot;online&quot;:&quot;Online&quot;,&quot;idle&quot;:&quot;Idle&quot;,"
    "&quot;dnd&quot;:&quot;Do not disturb&quot;,&quot;offline&quot;:&quot;Offline&quot;,"
    "&quot;onlineText&quot;:&quot;online&quot;,&quot;justNow&quot;:&quot;just now&quot;,"
    "&quot;recently&quot;:&quot;last seen recently&quot;,"
    "&quot;within_week&quot;:&quot;last seen within a week&quot;,"
    "&quot;within_month&quot;:&quot;last seen within a month&quot;,"
    "&quot;long_ago&quot;:&quot;last seen a long time ago&quot;," + quoted(WORDS_EN) + "}"
)
#: the script a logged-in user gets, their id put in for SELF
SCRIPT = (
    '<script src="/static/presence/presence.js" '
    'data-presence-endpoint="/presence/api/presence" '
    'data-presence-status-endpoint="/presence/api/status" '
    'data-presence-socket="/ws/presence/" '
    'data-presence-heartbeat="30" data-presence-idle-after="300" '
    f'data-presence-labels="{LABELS}" data-presence-self="SELF" defer></script>'
)


def render(source: str, user: Any) -> str:
    """As ``render(request, ...)`` renders a page (the request context processor included)."""
    request = RequestFactory().get("/")
    request.user = user
    return Template("{% load presence %}" + source).render(RequestContext(request, {}))


def test_an_anonymous_visitor_gets_no_script() -> None:
    assert render("{% presence_script %}", AnonymousUser()) == ""
    assert render('{% presence_script socket="" %}', AnonymousUser()) == ""


def test_a_logged_in_user_gets_the_script(make_user: Callable[..., Any]) -> None:
    user = make_user()
    assert render("{% presence_script %}", user) == SCRIPT.replace("SELF", str(user.pk))


def test_the_demo_loads_presence_js_for_its_users_only(
    client: Client, make_user: Callable[..., Any]
) -> None:
    if not apps.is_installed("siteproject.demo"):
        pytest.skip("the demo is not installed on this site (tests.settings.uuid, ...)")
    login_page = client.get(reverse("demo:login"))
    assert login_page.status_code == 200
    assert b"presence/presence.js" not in login_page.content
    client.force_login(make_user())
    home = client.get(reverse("demo:home"))
    assert home.status_code == 200
    assert b'src="/static/presence/presence.js"' in home.content
