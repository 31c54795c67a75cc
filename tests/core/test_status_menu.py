"""{% presence_status_menu %}: the viewer's status in a header menu, by exact HTML (filled in
with the viewer's status, escaped, nothing for anonymous visitors), offering the settings
page's clearing choices, and posted without JavaScript to the settings page, which saves it and
goes back to the page it came from (never to another site's).

The menu saved through presence.js in a real browser: tests/browser/test_browser_status_menu.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.template import Context, Template
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone, translation

from presence import api
from presence.models import PrivacySettings, UserStatus
from tests.clock import T0
from tests.privacy_page_cases import controls

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]

SETTINGS = reverse("presence:settings")
CSRF = re.compile(r'<input type="hidden" name="csrfmiddlewaretoken" value="[^"]+">')


def request_for(user: Any, path: str = "/feed/?page=2") -> Any:
    request = RequestFactory().get(path)
    request.user = user
    return request


def render(request: Any, source: str = "{% presence_status_menu %}", **context: Any) -> str:
    if request is not None:
        context["request"] = request
    return Template("{% load presence %}" + source).render(Context(context))


def menu(user: Any, path: str = "/feed/?page=2", **context: Any) -> str:
    """The menu, its CSRF token (random) left out."""
    html, found = CSRF.subn("", render(request_for(user, path), **context))
    assert found == 1, html
    return html


class _Form(HTMLParser):
    """What the menu's form submits untouched, and the clearing choices it offers."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.offered: list[str] = []
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name:
            if a.get("type") != "radio" or "checked" in a:
                self.values[name] = a.get("value") or ""
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select:
            self.offered.append(a.get("value") or "")
            if "selected" in a:
                self.values[self._select] = a.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


def form_of(html: str) -> _Form:
    parser = _Form()
    parser.feed(html)
    return parser


@pytest.fixture
def ann(make_user: Callable[..., Any], clock: time_machine.Coordinates) -> Any:
    return make_user("ann")


@pytest.fixture
def ann_client(ann: Any) -> Client:
    client = Client()
    client.force_login(ann)
    return client


# --- the markup -------------------------------------------------------------------------------


def test_nothing_for_an_anonymous_visitor_or_without_a_request() -> None:
    assert render(request_for(AnonymousUser())) == ""
    assert render(None) == ""


EXPECTED = (
    '<details class="presence-status-menu" data-presence-status-menu>\n'
    '  <summary class="presence-status-menu__button" data-presence-status-summary'
    ' data-presence-status-empty="Set status">🥪 &lt;b&gt;&quot;Lunch&quot; &amp; co&lt;/b&gt;'
    "</summary>\n"
    '  <form class="presence-status-menu__panel" action="/presence/settings/" method="post"'
    ' novalidate aria-label="Your status" data-presence-now="2030-01-07T09:30:00+00:00"'
    ' data-presence-self="{pk}" data-presence-time-zone="UTC"'
    ' data-presence-activity="&lt;i&gt;reading&lt;/i&gt;"'
    ' data-presence-keep-label="as set: %(when)s"'
    ' data-presence-expired="That time has passed: choose when to clear again.">\n'
    '    <input type="hidden" name="next" value="/feed/?page=2&amp;q=%22x%22">'
    '<input type="hidden" name="initial-status" value="dnd">'
    '<input type="hidden" name="initial-emoji" value="🥪">'
    '<input type="hidden" name="initial-text"'
    ' value="&lt;b&gt;&quot;Lunch&quot; &amp; co&lt;/b&gt;">'
    '<input type="hidden" name="initial-expires" value="keep">\n'
    '    <fieldset class="presence-status-menu__group">\n'
    "      <legend>Show me as</legend>\n"
    '      <label class="presence-status-menu__choice" for="presence-status-menu-status_0">'
    '<input type="radio" name="status" value="auto" id="presence-status-menu-status_0" required>'
    " Automatic — online while you are active</label>"
    '<label class="presence-status-menu__choice" for="presence-status-menu-status_1">'
    '<input type="radio" name="status" value="dnd" id="presence-status-menu-status_1" required'
    " checked> Do not disturb</label>"
    '<label class="presence-status-menu__choice" for="presence-status-menu-status_2">'
    '<input type="radio" name="status" value="invisible" id="presence-status-menu-status_2"'
    " required> Invisible — appear offline to everyone</label>\n"
    "    </fieldset>\n"
    '    <div class="presence-status-menu__field">\n'
    '      <label for="presence-status-menu-emoji">Emoji</label>\n'
    '      <input type="text" name="emoji" value="🥪" maxlength="16"'
    ' id="presence-status-menu-emoji">\n'
    "    </div>\n"
    '    <div class="presence-status-menu__field">\n'
    '      <label for="presence-status-menu-text">Status text</label>\n'
    '      <input type="text" name="text" value="&lt;b&gt;&quot;Lunch&quot; &amp; co&lt;/b&gt;"'
    ' maxlength="140" aria-describedby="presence-status-menu-text_helptext"'
    ' id="presence-status-menu-text">\n'
    '      <p class="presence-status-menu__help" id="presence-status-menu-text_helptext">'
    "Up to 140 characters.</p>\n"
    "    </div>\n"
    '    <div class="presence-status-menu__field">\n'
    '      <label for="presence-status-menu-expires">Clear the text and emoji</label>\n'
    '      <select name="expires" id="presence-status-menu-expires">'
    '<option value="keep" data-presence-expires-at="2030-01-07T11:30:00+00:00" selected>'
    "as set: Jan. 7, 2030, 11:30 a.m.</option>"
    '<option value="30m" data-presence-expires-in="1800">in 30 minutes</option>'
    '<option value="1h" data-presence-expires-in="3600">in 1 hour</option>'
    '<option value="4h" data-presence-expires-in="14400">in 4 hours</option>'
    '<option value="today" data-presence-expires-at="2030-01-08T00:00:00+00:00"'
    " data-presence-expires-daily>at midnight"
    "</option>"
    '<option value="never">never</option></select>\n'
    "    </div>\n"
    '    <p class="presence-status-menu__error" role="alert" data-presence-status-error hidden>'
    "</p>\n"
    '    <div class="presence-status-menu__actions">\n'
    '      <button class="presence-status-menu__save" type="submit">Save status</button>\n'
    '      <a class="presence-status-menu__more" href="/presence/settings/">More settings</a>\n'
    "    </div>\n"
    "  </form>\n"
    '  <span data-presence-text="{pk}" hidden></span>\n'
    "</details>\n"
    '<script src="/static/presence/status-menu.js" defer></script>\n'
)


def test_the_menu_is_filled_in_with_the_viewers_status_escaped(ann: Any) -> None:
    api.set_status(
        ann,
        "dnd",
        text='<b>"Lunch" & co</b>',
        emoji="🥪",
        activity="<i>reading</i>",
        expires_at=T0 + timedelta(hours=2),
    )
    assert menu(ann, '/feed/?page=2&q="x"') == EXPECTED.replace("{pk}", str(ann.pk))


def test_the_menu_names_the_time_zone_its_times_are_written_in(ann: Any) -> None:
    """The script writes a time it sets as the server wrote this one: in the same zone."""
    api.set_status(ann, "auto", text="Lunch", expires_at=T0 + timedelta(hours=2))
    with timezone.override("Asia/Tokyo"):
        html = menu(ann)
    assert 'data-presence-time-zone="Asia/Tokyo"' in html
    assert ">as set: Jan. 7, 2030, 8:30 p.m.</option>" in html  # 11:30 UTC


def test_a_user_without_a_status_gets_the_defaults(ann: Any) -> None:
    html = menu(ann)
    assert (
        'data-presence-status-empty="Set status">Set status</summary>' in html
        and 'data-presence-activity=""' in html
    )
    form = form_of(html)
    shown = {"status": "auto", "emoji": "", "text": "", "expires": "never"}
    assert form.values == {
        "next": "/feed/?page=2",
        **shown,
        **{f"initial-{name}": value for name, value in shown.items()},
    }
    assert form.offered == ["30m", "1h", "4h", "today", "never"]  # nothing "as set"


def test_an_invisible_user_is_shown_as_invisible(ann: Any) -> None:
    api.set_status(ann, "invisible")
    assert form_of(menu(ann)).values["status"] == "invisible"


def test_a_custom_status_that_cleared_is_not_shown(ann: Any, clock: Any) -> None:
    api.set_status(ann, "dnd", text="Lunch", expires_at=T0 + timedelta(minutes=30))
    clock.shift(30 * 60)
    html = menu(ann)
    assert ">Set status</summary>" in html
    shown = {"status": "dnd", "emoji": "", "text": "", "expires": "never"}  # dnd stays
    assert form_of(html).values | {"next": ""} == {
        "next": "",
        **shown,
        **{f"initial-{name}": value for name, value in shown.items()},
    }


@pytest.mark.parametrize(
    ("max_expiry", "offered"),
    [
        (3600, ["30m", "1h", "never"]),
        (14 * 3600, ["30m", "1h", "4h", "never"]),  # midnight is 14.5 hours away
        (15 * 3600, ["30m", "1h", "4h", "today", "never"]),
    ],
)
def test_the_menu_offers_the_settings_pages_choices(
    ann: Any, ann_client: Client, settings: Any, max_expiry: int, offered: list[str]
) -> None:
    settings.PRESENCE = {"MAX_STATUS_EXPIRY": max_expiry}
    assert form_of(menu(ann)).offered == offered
    page = ann_client.get(SETTINGS).content.decode()
    on_the_page = re.search(r"<form[^>]*data-presence-settings.*?</form>", page, re.S)
    assert on_the_page is not None
    assert form_of(on_the_page.group()).offered == offered


def test_the_menu_carries_the_csp_nonce(ann: Any) -> None:
    # Django's csp context processor puts csp_nonce in the context; django-csp sets it on the
    # request.
    script = '<script src="/static/presence/status-menu.js" defer nonce="{}"></script>'
    assert script.format("fr0m-django") in menu(ann, csp_nonce="fr0m-django")
    request = request_for(ann)
    request.csp_nonce = "r4nd0m"
    assert script.format("r4nd0m") in render(request)


def test_template_name_replaces_the_template(ann: Any, settings: Any) -> None:
    api.set_status(ann, "dnd", text="Lunch")
    mine = "<form>{{ form.status.value }} {{ custom }} {{ next }}</form>"
    engine = settings.TEMPLATES[0]
    settings.TEMPLATES = [
        {
            **engine,
            "APP_DIRS": False,
            "OPTIONS": {
                **engine["OPTIONS"],
                "loaders": [
                    ("django.template.loaders.locmem.Loader", {"mine/menu.html": mine}),
                    "django.template.loaders.app_directories.Loader",
                ],
            },
        }
    ]
    html = render(request_for(ann), '{% presence_status_menu template_name="mine/menu.html" %}')
    assert html == "<form>dnd Lunch /feed/?page=2</form>"


def test_the_menu_costs_one_query(ann: Any) -> None:
    api.set_status(ann, "invisible", text="Away", expires_at=T0 + timedelta(hours=1))
    request = request_for(ann)
    with CaptureQueriesContext(connection) as queries:
        html = render(request)
    assert 'value="invisible" id="presence-status-menu-status_2" required checked>' in html
    assert len(queries) == 1


def test_the_menu_speaks_the_users_language(ann: Any) -> None:
    with translation.override("ja"):
        html = menu(ann)
    assert ">ステータスを設定</summary>" in html and ">ステータスを保存</button>" in html
    assert ">その他の設定</a>" in html and ">表示する状態</legend>" in html
    assert 'data-presence-keep-label="設定どおり: %(when)s"' in html  # for the script to fill
    assert "Set status" not in html and "Save status" not in html and "More settings" not in html


# --- posted without JavaScript -----------------------------------------------------------------


def submitted(user: Any, path: str = "/feed/?page=2", **changes: str) -> dict[str, str]:
    """What the menu posts, with ``changes`` typed in."""
    return {**form_of(menu(user, path)).values, **changes}


def test_posted_it_saves_and_goes_back_to_the_page(ann: Any, ann_client: Client) -> None:
    values = submitted(ann, status="dnd", emoji="🎧", text="Focus", expires="1h")
    response = ann_client.post(SETTINGS, values)
    assert response.status_code == 302 and response.url == "/feed/?page=2"
    row = UserStatus.objects.get(user=ann)
    assert (row.dnd, row.emoji, row.text, row.expires_at) == (
        True,
        "🎧",
        "Focus",
        T0 + timedelta(hours=1),
    )
    assert api.get_presence(ann, ann).text == "Focus"


def test_saved_again_it_keeps_when_the_text_clears(
    ann: Any, ann_client: Client, clock: Any
) -> None:
    api.set_status(ann, "auto", text="Lunch", activity="eating", expires_at=T0 + timedelta(hours=2))
    clock.shift(600)
    values = submitted(ann, status="dnd")
    assert values["expires"] == "keep"
    assert ann_client.post(SETTINGS, values).status_code == 302
    row = UserStatus.objects.get(user=ann)
    # The activity, which the menu does not edit, is kept as the settings page keeps it.
    assert (row.dnd, row.text, row.activity, row.expires_at) == (
        True,
        "Lunch",
        "eating",
        T0 + timedelta(hours=2),
    )


def test_posted_it_keeps_a_status_saved_elsewhere_since_it_was_rendered(
    ann: Any, ann_client: Client
) -> None:
    """Measured against what the menu showed: only the mode changed in it, so the custom
    status another tab saved after the menu was rendered is kept."""
    values = submitted(ann, status="dnd")  # shown: automatic, no custom status
    api.set_status(ann, "auto", text="Focus", emoji="🎧", activity="coding")
    assert ann_client.post(SETTINGS, values).status_code == 302
    row = UserStatus.objects.get(user=ann)
    assert (row.dnd, row.text, row.emoji, row.activity) == (True, "Focus", "🎧", "coding")


def test_invisible_from_the_menu(ann: Any, ann_client: Client) -> None:
    assert ann_client.post(SETTINGS, submitted(ann, status="invisible")).status_code == 302
    assert PrivacySettings.objects.get(user=ann).invisible is True


@pytest.mark.parametrize(
    "foreign",
    [
        "https://evil.example/",
        "//evil.example/feed/",
        "http://evil.example",
        "///evil.example/",
        "https:evil.example",
        "javascript:alert(1)",
        "\\\\evil.example",
    ],
)
def test_a_next_on_another_site_is_not_followed(ann: Any, ann_client: Client, foreign: str) -> None:
    values = submitted(ann, text="Here", next=foreign)
    response = ann_client.post(SETTINGS, values)
    assert response.status_code == 302 and response.url == SETTINGS
    assert UserStatus.objects.get(user=ann).text == "Here"  # saved all the same


def test_a_post_needs_the_csrf_token(ann: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(ann)
    values = submitted(ann, text="Forged")
    assert client.post(SETTINGS, values).status_code == 403
    assert not UserStatus.objects.filter(user=ann).exists()
    # With the token of a page the user was shown, it saves.
    token = controls(client.get(SETTINGS).content.decode()).values["csrfmiddlewaretoken"]
    response = client.post(SETTINGS, {**values, "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and response.url == "/feed/?page=2"
    assert UserStatus.objects.get(user=ann).text == "Forged"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"text": "x" * 141}, "Ensure this value has at most 140 characters (it has 141)."),
        ({"status": "asleep"}, "Select a valid choice. asleep is not one of the available"),
        ({"expires": "keep"}, "Select a valid choice. keep is not one of the available"),
        ({"text": "bad\x1b[31m"}, "'text' must not contain control characters."),
    ],
)
def test_bad_input_shows_the_settings_page_with_the_error_and_saves_nothing(
    ann: Any, ann_client: Client, change: dict[str, str], error: str
) -> None:
    values = submitted(ann, **{"text": "Changed too", **change})
    response = ann_client.post(SETTINGS, values)
    assert response.status_code == 200
    html = response.content.decode().replace("&quot;", '"').replace("&#x27;", "'")
    assert error in html
    assert "Nothing was saved: please correct what is marked below." in html
    assert not UserStatus.objects.filter(user=ann).exists()
    # The corrected form still goes back to the page the menu was on.
    again = controls(response.content.decode()).values
    assert again["next"] == "/feed/?page=2"
    fixed = {**again, "status": "auto", "text": "Fixed", "expires": "never"}
    assert ann_client.post(SETTINGS, fixed).url == "/feed/?page=2"
    assert UserStatus.objects.get(user=ann).text == "Fixed"


def test_a_time_as_set_that_passed_meanwhile_is_an_error(
    ann: Any, ann_client: Client, clock: Any
) -> None:
    api.set_status(ann, "auto", text="Lunch", expires_at=T0 + timedelta(minutes=30))
    values = submitted(ann, status="dnd")
    clock.shift(31 * 60)
    response = ann_client.post(SETTINGS, values)
    assert response.status_code == 200
    assert "Select a valid choice. keep is not one of the available" in response.content.decode()
    assert UserStatus.objects.get(user=ann).dnd is False
