"""The settings page (presence:settings) as a browser submits it: what its form holds, for the
tests that post it (tests/core/test_settings_page.py, tests/sites/test_demo.py)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from django.test import Client
from django.urls import reverse

URL = reverse("presence:settings")


class _Controls(HTMLParser):
    """The controls of the settings form (not the layout's other forms) as a browser submits
    them: {name: value} (the checked radio, the selected option, text and hidden inputs), and
    every name seen."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.names: list[str] = []
        self._select: str | None = None
        self._in_post = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self._in_post = "data-presence-settings" in a
        if not self._in_post or "form" in a:  # the search box belongs to the GET form
            return
        name = a.get("name")
        if tag == "input" and name:
            self.names.append(name)
            if a.get("type") not in ("radio", "checkbox") or "checked" in a:
                self.values[name] = a.get("value") or ""
        elif tag == "select" and name:
            self.names.append(name)
            self._select = name
            self.values.setdefault(name, "")
        elif tag == "option" and self._select and "selected" in a:
            self.values[self._select] = a.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        if tag == "form":
            self._in_post = False


def controls(html: str) -> _Controls:
    parser = _Controls()
    parser.feed(html)
    return parser


def page(client: Client, query: str = "") -> dict[str, str]:
    """What the page's form would submit untouched."""
    response = client.get(URL + query)
    assert response.status_code == 200
    return controls(response.content.decode()).values


def row_of(values: dict[str, str], user: Any) -> str:
    """The formset prefix of ``user``'s row ("share-0")."""
    return next(
        k[: -len("-viewer")]
        for k, v in values.items()
        if k.endswith("-viewer") and v == str(user.pk)
    )
