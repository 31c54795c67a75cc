"""Presence's tags inside a site's nested inclusion tags (issue 29): three levels deep, whether
or not the site's tags take the context, the dot is the one the logged-in viewer sees, never
the one a stranger sees. Django's inclusion tags render in a context holding only what the tag
returned; the request survives only as the context's ``request`` attribute."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from django import template
from django.contrib.auth.models import AnonymousUser
from django.template import Context, RequestContext
from django.template.engine import Engine
from django.test import RequestFactory
from django.test.utils import override_settings

from presence import api, rendering
from presence.models import Contact, PrivacySettings
from tests.stamping import without_stamps

pytestmark = pytest.mark.django_db

#: a news site's tags, as the issue's site has them: link_user inside news_item inside
#: item_control; link_user in two forms (the issue's owner tried takes_context=True first)
register = template.Library()


@register.inclusion_tag("item_control.html")
def item_control(item: Any) -> dict[str, Any]:
    return {"item": item}


@register.inclusion_tag("news_item.html")
def news_item(item: Any) -> dict[str, Any]:
    return {"item": item}


@register.inclusion_tag("link_user.html")
def link_user(user: Any) -> dict[str, Any]:
    return {"user": user}


@register.inclusion_tag("link_user.html", takes_context=True)
def link_user_with_context(context: Context, user: Any) -> dict[str, Any]:
    return {"user": user}  # the context taken, but no request handed on


TEMPLATES = {
    "page.html": "{% load news %}{% for item in items %}{% item_control item %}{% endfor %}",
    "item_control.html": '{% load news %}<div class="ctl">{% news_item item %}</div>',
    "news_item.html": (
        "{% load news %}{{ item.title }} by "
        "{% if item.with_context %}{% link_user_with_context item.author %}"
        "{% else %}{% link_user item.author %}{% endif %}"
    ),
    "link_user.html": (
        '{% load presence %}<a href="/user/{{ user.pk }}">{{ user.username }}</a> '
        "{% presence_dot user %}"
    ),
}


def engine(*, request_processor: bool) -> Engine:
    processors = ["django.template.context_processors.request"] if request_processor else []
    return Engine(
        loaders=[("django.template.loaders.locmem.Loader", TEMPLATES)],
        libraries={"news": __name__, "presence": "presence.templatetags.presence"},
        context_processors=processors,
    )


def dot(pk: Any, status: str, label: str) -> str:
    return (
        f'<span class="presence-dot presence-dot--{status}" data-presence-user="{pk}" '
        f'title="{label}" aria-label="{label}" role="img"></span>'
    )


def request_for(user: Any) -> Any:
    request = RequestFactory().get("/")
    request.user = user
    return request


@pytest.fixture
def news(make_user: Callable[..., Any]) -> SimpleNamespace:
    """ann and ben are friends (mutual contacts); ben is online and shows it to contacts only;
    cy is nobody to ben."""
    ann, ben, cy = make_user("ann"), make_user("ben"), make_user("cy")
    Contact.objects.create(owner=ann, contact=ben)
    Contact.objects.create(owner=ben, contact=ann)
    PrivacySettings.objects.create(
        user=ben,
        online_visibility="contacts",
        last_seen_visibility="contacts",
        activity_visibility="contacts",
    )
    api.touch(ben)
    return SimpleNamespace(ann=ann, ben=ben, cy=cy)


def page(news: SimpleNamespace, viewer: Any, *, with_context: bool, processor: bool) -> str:
    items = [SimpleNamespace(title="Show HN", author=news.ben, with_context=with_context)]
    source = engine(request_processor=processor).get_template("page.html")
    html = source.render(RequestContext(request_for(viewer), {"items": items}))
    return without_stamps(html, viewer)


@pytest.mark.parametrize("processor", [True, False], ids=["request-processor", "no-processor"])
@pytest.mark.parametrize("with_context", [False, True], ids=["plain", "takes_context"])
def test_three_inclusion_tags_deep_the_dot_is_the_viewers(
    news: SimpleNamespace,
    with_context: bool,
    processor: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rendering, "_warned_without_request", False)
    with caplog.at_level("WARNING", logger="presence"), override_settings(DEBUG=True):
        html = page(news, news.ann, with_context=with_context, processor=processor)
    ben = news.ben
    assert html == (
        f'<div class="ctl">Show HN by <a href="/user/{ben.pk}">ben</a> '
        f"{dot(ben.pk, 'online', 'Online')}</div>"
    )
    assert caplog.records == []  # it found the request: no "without `request`" warning


@pytest.mark.parametrize("with_context", [False, True], ids=["plain", "takes_context"])
def test_three_inclusion_tags_deep_a_stranger_still_sees_a_stranger_s_dot(
    news: SimpleNamespace, with_context: bool
) -> None:
    ben = news.ben
    want = (
        f'<div class="ctl">Show HN by <a href="/user/{ben.pk}">ben</a> '
        f"{dot(ben.pk, 'offline', 'Offline')}</div>"
    )
    assert page(news, news.cy, with_context=with_context, processor=True) == want
    assert page(news, AnonymousUser(), with_context=with_context, processor=True) == want


def test_the_request_is_found_on_a_copied_context_and_the_variable_wins() -> None:
    request, other = RequestFactory().get("/a"), RequestFactory().get("/b")
    context = RequestContext(request, {})
    nested = context.new({"user": None}).new({})  # what two inclusion tags render in
    assert rendering.request_of(nested) is request
    assert rendering.request_of(Context({"request": other})) is other
    assert rendering.request_of(RequestContext(request, {"request": other})) is other
    assert rendering.request_of(Context({})) is None
    assert rendering.request_of(None) is None
