"""The default {% online_friends_list %} looks at home on a compact site (issue 29): its markup
is unchanged, and presence.css takes the bullets and the indent off its list."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.template import RequestContext, Template
from django.test import RequestFactory

pytestmark = pytest.mark.django_db

CSS = Path(__file__).resolve().parents[2] / "presence" / "static" / "presence" / "presence.css"


def rules(css: str) -> dict[str, dict[str, str]]:
    """Selector -> {property: value} of the stylesheet's top-level rules."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    found: dict[str, dict[str, str]] = {}
    for selector, body in re.findall(r"([^{}@]+)\{([^{}]*)\}", css):
        declarations = (d.split(":", 1) for d in body.split(";") if ":" in d)
        found[selector.strip()] = {k.strip(): v.strip() for k, v in declarations}
    return found


def test_the_stylesheet_unstyles_the_friends_list() -> None:
    assert finders.find("presence/presence.css") == str(CSS)
    rule = rules(CSS.read_text())[".presence-friends__list"]
    assert rule == {"list-style": "none", "padding-left": "0"}


def test_the_default_list_carries_that_class(make_user: Callable[..., Any]) -> None:
    request = RequestFactory().get("/")
    request.user = make_user()
    html = Template("{% load presence %}{% online_friends_list %}").render(
        RequestContext(request, {})
    )
    assert '<ul class="presence-friends__list">' in html
