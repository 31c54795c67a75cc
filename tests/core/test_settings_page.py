"""The ready settings page, ``presence:settings`` (presence.pages): privacy levels, status
(automatic / do not disturb / invisible, custom text and emoji, expiry) and per-person
exceptions, saved through the paths the API and the admin take; bad input changes nothing;
login, CSRF and HTTP_RATE_LIMIT as the rest of presence; a change reaches open sockets at once.

The browser's side (every field saved through a real page): tests/browser/test_browser_settings.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
import time_machine
from asgiref.sync import sync_to_async
from django.test import Client
from django.utils import timezone

from presence import api
from presence.models import Contact, PrivacyException, PrivacySettings, UserStatus
from presence.pages.people import SHOWN_MAX
from tests.ids import missing_id
from tests.live.sockets import (
    HIDDEN,
    Sockets,
    assert_silent,
    diff,
    lets_see,
    new_user,
    online,
    presence,
    receive,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.privacy_cases import quiet_login
from tests.privacy_page_cases import URL, controls, page, row_of

#: runs again on the UUID-keyed site (ids in the formset, the people looked up by them)
pytestmark = pytest.mark.uuid_site

LEVELS = ("online_visibility", "last_seen_visibility", "activity_visibility")


def stored(*users: Any) -> dict[str, Any]:
    """Everything the page can write, for these users."""
    ids = [u.pk for u in users]
    return {
        model.__name__: sorted(map(repr, model.objects.filter(**{key: ids}).values()))
        for model, key in (
            (PrivacySettings, "user__in"),
            (UserStatus, "user__in"),
            (PrivacyException, "owner__in"),
            (Contact, "owner__in"),
        )
    }


@pytest.fixture
def people(make_user: Callable[..., Any]) -> dict[str, Any]:
    """ann's contacts: bob and cy; dee is a stranger to ann; eve is one too, but ann has an
    exception for her (made before ann removed her from her contacts)."""
    ann, bob, cy, dee, eve = (make_user(n) for n in ("ann", "bob", "cy", "dee", "eve"))
    Contact.objects.create(owner=ann, contact=bob)
    Contact.objects.create(owner=ann, contact=cy, close_friend=True)
    Contact.objects.create(owner=dee, contact=ann)  # dee follows ann: not ann's contact
    PrivacyException.objects.create(owner=ann, viewer=eve, setting="online_visibility", allow=False)
    return {"ann": ann, "bob": bob, "cy": cy, "dee": dee, "eve": eve}


@pytest.fixture
def ann_client(people: dict[str, Any], clock: time_machine.Coordinates) -> Client:
    client = Client()
    client.force_login(people["ann"])
    return client


# --- GET --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_page_shows_exactly_the_fields_with_the_users_values(
    ann_client: Client, people: dict[str, Any]
) -> None:
    ann, bob, cy, eve = people["ann"], people["bob"], people["cy"], people["eve"]
    PrivacySettings.objects.create(
        user=ann,
        online_visibility="everyone",
        last_seen_visibility="close_friends",
        activity_visibility="nobody",
    )
    api.set_status(
        ann, "dnd", text="Writing", emoji="✍️", expires_at=timezone.now() + timedelta(hours=2)
    )
    api.share_with(ann, bob, "last_seen_visibility", allow=True)
    response = ann_client.get(URL)
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    parsed = controls(response.content.decode())
    values = parsed.values
    rows = {values[f"share-{i}-viewer"] for i in range(3)}
    # Those with an exception first (eve, then bob, by username), then the other contacts.
    assert [values[f"share-{i}-viewer"] for i in range(3)] == [str(bob.pk), str(eve.pk), str(cy.pk)]
    assert rows == {str(bob.pk), str(cy.pk), str(eve.pk)}  # not dee: a stranger
    expected = {
        "csrfmiddlewaretoken": values["csrfmiddlewaretoken"],
        "status": "dnd",
        "emoji": "✍️",
        "text": "Writing",
        "expires": "keep",
        # what the page showed, posted back (a change is measured against it)
        "initial-status": "dnd",
        "initial-emoji": "✍️",
        "initial-text": "Writing",
        "initial-expires": "keep",
        "initial-online_visibility": "everyone",
        "initial-last_seen_visibility": "close_friends",
        "initial-activity_visibility": "nobody",
        "online_visibility": "everyone",
        "last_seen_visibility": "close_friends",
        "activity_visibility": "nobody",
        "share-TOTAL_FORMS": "3",
        "share-INITIAL_FORMS": "3",
        "share-MIN_NUM_FORMS": "0",
        "share-MAX_NUM_FORMS": str(SHOWN_MAX),
    }
    current = {bob.pk: {"last_seen_visibility": "always"}, eve.pk: {"online_visibility": "never"}}
    for i in range(3):
        pk = values[f"share-{i}-viewer"]
        expected[f"share-{i}-viewer"] = pk
        for level in LEVELS:
            expected[f"share-{i}-{level}"] = next(
                (v for k, c in current.items() if str(k) == pk for s, v in c.items() if s == level),
                "",
            )
    assert values == expected
    # Each radio group offers its choices once, nothing else is in the form.
    assert sorted(set(parsed.names)) == sorted(expected)
    html = response.content.decode()
    for label in ("Everyone", "My contacts", "Close friends", "Nobody", "Do not disturb"):
        assert label in html
    assert "(not one of your contacts)" in html  # eve's row says why it is there


@pytest.mark.django_db
def test_a_user_without_rows_sees_the_defaults_and_a_get_saves_nothing(
    ann_client: Client, people: dict[str, Any]
) -> None:
    before = stored(people["ann"])
    values = page(ann_client)
    assert {k: values[k] for k in LEVELS} == dict.fromkeys(LEVELS, "contacts")
    assert (values["status"], values["text"], values["emoji"], values["expires"]) == (
        "auto",
        "",
        "",
        "never",
    )
    assert stored(people["ann"]) == before
    # Submitting the page untouched writes nothing either (no row for the defaults).
    assert ann_client.post(URL, values).status_code == 302
    assert stored(people["ann"]) == before


@pytest.mark.django_db
def test_the_search_narrows_the_people_listed(ann_client: Client, people: dict[str, Any]) -> None:
    values = page(ann_client, "?q=C")
    assert values["share-TOTAL_FORMS"] == "1" and values["share-0-viewer"] == str(people["cy"].pk)
    assert "None of your contacts matches" in ann_client.get(URL + "?q=zz").content.decode()
    # A control character in the search is an error of the search, not a server error.
    response = ann_client.get(URL + "?q=%1B")
    assert response.status_code == 200 and "control characters" in response.content.decode()
    response = ann_client.get(URL + "?q=%00")
    assert (
        response.status_code == 200
        and "Null characters are not allowed" in response.content.decode()
    )


@pytest.mark.django_db
def test_each_person_carries_what_the_search_matches(
    ann_client: Client, people: dict[str, Any]
) -> None:
    # The page's filter (presence/settings.js) matches what ?q= matches: the username and the
    # first and last names, beside the name shown.
    bob = people["bob"]
    bob.first_name, bob.last_name = "Robert", "Stone"
    bob.save()
    html = ann_client.get(URL).content.decode()
    rows = re.findall(r"<fieldset[^>]*data-presence-person=[^>]*>", html)
    bob_row = next(row for row in rows if 'data-presence-person="Robert Stone"' in row)
    assert f'data-presence-person-search="{bob.get_username()}\nRobert\nStone"' in bob_row
    assert "Robert Stone" in ann_client.get(URL + "?q=bob").content.decode()


@pytest.mark.django_db
def test_the_search_finds_a_person_by_the_full_name_shown(
    ann_client: Client, people: dict[str, Any]
) -> None:
    # The page's filter matches the name shown ("Robert Stone"): submitted, the same words
    # must find the same person.
    bob = people["bob"]
    bob.first_name, bob.last_name = "Robert", "Stone"
    bob.save()
    for query in ("Robert Stone", "robert stone", "ert sto"):
        values = page(ann_client, "?" + urlencode({"q": query}))
        assert values["share-TOTAL_FORMS"] == "1", query
        assert values["share-0-viewer"] == str(bob.pk), query
    nobody = ann_client.get(URL, {"q": "Stone Robert"}).content.decode()
    assert "None of your contacts matches" in nobody


# --- POST -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_post_saves_each_field(
    ann_client: Client, people: dict[str, Any], clock: time_machine.Coordinates
) -> None:
    ann, bob, cy, eve = people["ann"], people["bob"], people["cy"], people["eve"]
    values = page(ann_client)
    bob_row, cy_row, eve_row = (row_of(values, u) for u in (bob, cy, eve))
    values.update(
        {
            "online_visibility": "everyone",
            "last_seen_visibility": "close_friends",
            "activity_visibility": "nobody",
            "status": "dnd",
            "text": "In a meeting",
            "emoji": "📅",
            "expires": "1h",
            f"{bob_row}-online_visibility": "never",
            f"{cy_row}-activity_visibility": "always",
            f"{eve_row}-online_visibility": "",  # removes an exception for a non-contact
        }
    )
    response = ann_client.post(URL, values)
    assert response.status_code == 302 and response.url == URL
    row = PrivacySettings.objects.get(user=ann)
    assert (row.online_visibility, row.last_seen_visibility, row.activity_visibility) == (
        "everyone",
        "close_friends",
        "nobody",
    )
    assert row.invisible is False
    status = UserStatus.objects.get(user=ann)
    assert (status.dnd, status.text, status.emoji) == (True, "In a meeting", "📅")
    assert status.expires_at == timezone.now() + timedelta(hours=1)
    assert sorted(
        PrivacyException.objects.filter(owner=ann).values_list("viewer", "setting", "allow")
    ) == sorted([(bob.pk, "online_visibility", False), (cy.pk, "activity_visibility", True)])
    # Presence as others see it follows (bob: never; dee, a stranger: everyone).
    assert api.get_presence(ann, bob).status == "offline"
    assert api.get_presence(ann, people["dee"]).status == "dnd"
    assert "Your settings are saved." in ann_client.get(URL).content.decode()

    # Invisible, and the expiry kept as it was; the exceptions back to the levels.
    values = page(ann_client)
    assert values["expires"] == "keep"
    values.update(
        {"status": "invisible", "text": "Away", f"{row_of(values, bob)}-online_visibility": ""}
    )
    values[f"{row_of(values, cy)}-activity_visibility"] = ""
    clock.shift(60)
    assert ann_client.post(URL, values).status_code == 302
    assert PrivacySettings.objects.get(user=ann).invisible is True
    status = UserStatus.objects.get(user=ann)
    assert (status.dnd, status.text, status.expires_at) == (
        False,
        "Away",
        timezone.now() - timedelta(seconds=60) + timedelta(hours=1),
    )
    assert not PrivacyException.objects.filter(owner=ann).exists()
    assert api.get_presence(ann, people["dee"]).status == "offline"
    # Back to automatic with no custom status, never clearing.
    values = page(ann_client)
    values.update({"status": "auto", "text": "", "emoji": "", "expires": "never"})
    assert ann_client.post(URL, values).status_code == 302
    assert PrivacySettings.objects.get(user=ann).invisible is False
    status = UserStatus.objects.get(user=ann)
    assert (status.dnd, status.text, status.emoji, status.expires_at) == (False, "", "", None)


#: (local time in New York, MAX_STATUS_EXPIRY, the next midnight in UTC if "at midnight" may
#: be chosen then): the clocks go back on 2025-11-02 (a 25-hour day), forward on 2025-03-09
MIDNIGHTS = [
    ("2025-11-02T00:30", 86400, None),  # midnight is 24.5 hours away: more than allowed
    ("2025-11-02T00:30", 90000, "2025-11-03T05:00"),
    ("2025-11-02T01:30", 86400, "2025-11-03T05:00"),  # the first 01:30 (EDT): 23.5 hours
    ("2025-03-09T00:30", 86400, "2025-03-10T04:00"),  # a 23-hour day
    ("2025-11-03T00:30", 86400, "2025-11-04T05:00"),
    ("2025-11-03T00:30", 23 * 3600, None),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("local", "max_expiry", "midnight"), MIDNIGHTS)
def test_at_midnight_is_offered_when_the_next_midnight_is_within_the_max_expiry(
    make_user: Callable[..., Any], settings: Any, local: str, max_expiry: int, midnight: str | None
) -> None:
    # The time really left until midnight decides, not a 24-hour day: offered, it is saved.
    settings.TIME_ZONE = "America/New_York"
    settings.PRESENCE = {"MAX_STATUS_EXPIRY": max_expiry}
    zone = ZoneInfo("America/New_York")
    client = Client()
    client.force_login(make_user())
    with time_machine.travel(datetime.fromisoformat(local).replace(tzinfo=zone), tick=False):
        values = page(client)
        html = client.get(URL).content.decode()
        form = re.search(r"<form[^>]*data-presence-settings.*?</form>", html, re.S)
        assert form is not None
        offered = 'value="today"' in form.group()  # the layout's own status menu left out
        values.update({"text": "Lunch", "expires": "today"})
        response = client.post(URL, values)
        saved = UserStatus.objects.filter(text="Lunch").values_list("expires_at", flat=True)
    assert offered is (midnight is not None)
    if midnight is None:
        assert response.status_code == 200 and not saved  # not a choice: a form error
    else:
        assert response.status_code == 302
        assert list(saved) == [datetime.fromisoformat(midnight).replace(tzinfo=UTC)]


def _status_of(user: Any) -> tuple[Any, ...]:
    row = UserStatus.objects.get(user=user)
    invisible = PrivacySettings.objects.filter(user=user, invisible=True).exists()
    return (invisible, row.dnd, row.text, row.emoji, row.expires_at)


@pytest.mark.django_db
def test_a_status_saved_elsewhere_meanwhile_is_kept_unless_changed_here(
    ann_client: Client, people: dict[str, Any]
) -> None:
    """The page measures a change against what it showed, not against the rows when it is
    posted: the status menu on the same page (or another tab) saved a status after the page
    was rendered; saving the page for something else must not put back the status it shows."""
    ann = people["ann"]
    values = page(ann_client)  # automatic, no custom status
    in_an_hour = timezone.now() + timedelta(hours=1)
    api.set_status(ann, "dnd", text="Focus", emoji="🎧", expires_at=in_an_hour)  # the menu's
    response = ann_client.post(URL, {**values, "online_visibility": "everyone"})
    assert response.status_code == 302
    assert PrivacySettings.objects.get(user=ann).online_visibility == "everyone"
    assert _status_of(ann) == (False, True, "Focus", "🎧", in_an_hour)

    # Only the mode changed here: the custom status saved elsewhere meanwhile is kept.
    values = page(ann_client)  # do not disturb, "🎧 Focus"
    in_half_an_hour = timezone.now() + timedelta(minutes=30)
    api.set_status(ann, "dnd", text="Lunch", expires_at=in_half_an_hour)
    assert ann_client.post(URL, {**values, "status": "invisible"}).status_code == 302
    assert _status_of(ann) == (True, False, "Lunch", "", in_half_an_hour)

    # Only the custom status changed here: the mode saved elsewhere meanwhile is kept.
    values = page(ann_client)  # invisible, "Lunch"
    api.set_status(ann, "auto", text="Lunch", expires_at=in_half_an_hour)
    changed = {"text": "Reading", "emoji": "📖", "expires": "1h"}
    assert ann_client.post(URL, {**values, **changed}).status_code == 302
    assert _status_of(ann) == (False, False, "Reading", "📖", timezone.now() + timedelta(hours=1))


@pytest.mark.django_db
def test_posted_without_what_the_page_showed_a_change_is_measured_against_the_rows(
    ann_client: Client, people: dict[str, Any], clock: time_machine.Coordinates
) -> None:
    """A site's own template that leaves the hidden inputs out: as stored is unchanged."""
    ann = people["ann"]
    api.set_status(ann, "dnd", text="Focus")
    values = {k: v for k, v in page(ann_client).items() if not k.startswith("initial-")}
    api.set_status(ann, "auto", text="Lunch")
    assert ann_client.post(URL, values).status_code == 302
    assert _status_of(ann) == (False, True, "Focus", "", None)  # the page's, as posted
    before = UserStatus.objects.get(user=ann).updated_at
    clock.shift(60)
    assert ann_client.post(URL, values).status_code == 302  # the same again: nothing saved
    assert UserStatus.objects.get(user=ann).updated_at == before


def _levels_of(user: Any) -> tuple[str, ...] | None:
    row = PrivacySettings.objects.filter(user=user).first()
    return None if row is None else tuple(getattr(row, level) for level in LEVELS)


def _set_elsewhere(user: Any, **levels: str) -> None:
    """The levels saved as the admin or another tab would, after the page was rendered."""
    row = PrivacySettings.objects.filter(user=user).first() or PrivacySettings(user=user)
    for name, value in levels.items():
        setattr(row, name, value)
    row.save()


@pytest.mark.django_db
def test_a_level_changed_elsewhere_meanwhile_is_kept_unless_changed_here(
    ann_client: Client, people: dict[str, Any]
) -> None:
    """The levels, as the status: a page rendered before a level was changed elsewhere (another
    tab, the admin, the API) and saved for something else must not put back the level it shows."""
    ann = people["ann"]
    _set_elsewhere(ann, online_visibility="everyone")
    values = page(ann_client)  # everyone, contacts, contacts
    _set_elsewhere(ann, last_seen_visibility="nobody", activity_visibility="close_friends")
    response = ann_client.post(URL, {**values, "online_visibility": "close_friends"})
    assert response.status_code == 302
    assert _levels_of(ann) == ("close_friends", "nobody", "close_friends")

    # Changed elsewhere and here too: the page's is saved; the page posted untouched saves none.
    values = page(ann_client)  # close_friends, nobody, close_friends
    _set_elsewhere(ann, online_visibility="nobody", last_seen_visibility="everyone")
    assert ann_client.post(URL, {**values, "last_seen_visibility": "contacts"}).status_code == 302
    assert _levels_of(ann) == ("nobody", "contacts", "close_friends")
    values = page(ann_client)
    _set_elsewhere(ann, activity_visibility="everyone")
    assert ann_client.post(URL, values).status_code == 302
    assert _levels_of(ann) == ("nobody", "contacts", "everyone")


@pytest.mark.django_db
def test_a_user_without_a_row_gets_none_for_a_level_back_to_the_default(
    ann_client: Client, people: dict[str, Any]
) -> None:
    """The row was removed since the page was rendered (the user's levels back to the site's
    defaults): changing a level on the page back to its default writes no row, a level that
    differs from the defaults writes one."""
    ann = people["ann"]
    _set_elsewhere(ann, online_visibility="everyone", last_seen_visibility="nobody")
    values = page(ann_client)  # everyone, nobody, contacts
    PrivacySettings.objects.filter(user=ann).delete()
    assert ann_client.post(URL, {**values, "online_visibility": "contacts"}).status_code == 302
    assert _levels_of(ann) is None
    assert ann_client.post(URL, {**values, "activity_visibility": "nobody"}).status_code == 302
    assert _levels_of(ann) == ("contacts", "contacts", "nobody")


@pytest.mark.django_db
def test_levels_posted_without_what_the_page_showed_are_measured_against_the_row(
    ann_client: Client, people: dict[str, Any]
) -> None:
    """An older page or a site's own template, without the hidden inputs: as before, a level
    that differs from the row is saved as posted."""
    ann = people["ann"]
    values = {k: v for k, v in page(ann_client).items() if not k.startswith("initial-")}
    _set_elsewhere(ann, online_visibility="everyone", last_seen_visibility="nobody")
    assert ann_client.post(URL, {**values, "activity_visibility": "nobody"}).status_code == 302
    assert _levels_of(ann) == ("contacts", "contacts", "nobody")


@pytest.mark.django_db
def test_the_search_is_kept_after_a_save(ann_client: Client, people: dict[str, Any]) -> None:
    values = page(ann_client, "?q=bo")
    values["share-0-last_seen_visibility"] = "always"
    response = ann_client.post(URL + "?q=bo", values)
    assert response.status_code == 302 and response.url == URL + "?q=bo"
    # Only bob's row was posted: eve's exception (not listed) is untouched.
    assert sorted(PrivacyException.objects.values_list("viewer", "setting", "allow")) == sorted(
        [
            (people["bob"].pk, "last_seen_visibility", True),
            (people["eve"].pk, "online_visibility", False),
        ]
    )


@pytest.mark.django_db
def test_a_part_a_sites_template_leaves_out_is_left_as_it_is(
    ann_client: Client, people: dict[str, Any]
) -> None:
    """A site overriding a block of presence/settings.html away (the status, the exceptions)
    posts none of its fields: that part is not touched, the others are saved."""
    ann = people["ann"]
    api.set_status(ann, "dnd", text="Busy")
    before = stored(ann)
    values = page(ann_client)
    levels_only = {k: values[k] for k in ("csrfmiddlewaretoken", *LEVELS)}
    response = ann_client.post(URL, {**levels_only, "online_visibility": "nobody"})
    assert response.status_code == 302
    after = stored(ann)
    assert PrivacySettings.objects.get(user=ann).online_visibility == "nobody"
    assert after["UserStatus"] == before["UserStatus"]
    assert after["PrivacyException"] == before["PrivacyException"]
    # Only the exceptions: the levels and the status stay.
    shares = {k: v for k, v in values.items() if k.startswith("share-")}
    shares[f"{row_of(values, people['bob'])}-online_visibility"] = "always"
    assert ann_client.post(URL, shares).status_code == 302
    assert PrivacySettings.objects.get(user=ann).online_visibility == "nobody"
    assert UserStatus.objects.get(user=ann).text == "Busy"
    assert PrivacyException.objects.filter(owner=ann, viewer=people["bob"], allow=True).exists()


def _bad(values: dict[str, str], people: dict[str, Any], case: str) -> dict[str, str]:
    bob_row, eve_row = row_of(values, people["bob"]), row_of(values, people["eve"])
    changes: dict[str, dict[str, str]] = {
        "unknown level": {"online_visibility": "martians"},
        "unknown status": {"status": "asleep"},
        "unknown exception": {f"{bob_row}-online_visibility": "sometimes"},
        "a stranger's row": {f"{bob_row}-viewer": str(people["dee"].pk)},
        "a foreign id": {f"{bob_row}-viewer": str(missing_id())},
        "not an id": {f"{bob_row}-viewer": "bob"},
        "the owner's own row": {f"{bob_row}-viewer": str(people["ann"].pk)},
        "a row twice": {f"{eve_row}-viewer": str(people["bob"].pk)},
        "a non-contact's exception changed": {f"{eve_row}-online_visibility": "always"},
        "a non-contact's new exception": {f"{eve_row}-last_seen_visibility": "never"},
        "oversize text": {"text": "x" * 141},
        "oversize emoji": {"emoji": "🙂" * 17},
        "a control character": {"text": "bad\x1b[31m"},
        "an unknown expiry": {"expires": "tomorrow"},
        "a kept expiry that is none": {"expires": "keep"},
        "no management form": {"share-TOTAL_FORMS": ""},
        "too many rows": {"share-TOTAL_FORMS": str(SHOWN_MAX + 1)},
    }
    return {**values, **changes[case], "text": changes[case].get("text", "changed too")}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "case",
    [
        "unknown level",
        "unknown status",
        "unknown exception",
        "a stranger's row",
        "a foreign id",
        "not an id",
        "the owner's own row",
        "a row twice",
        "a non-contact's exception changed",
        "a non-contact's new exception",
        "oversize text",
        "oversize emoji",
        "a control character",
        "an unknown expiry",
        "a kept expiry that is none",
        "no management form",
        "too many rows",
    ],
)
def test_bad_input_is_a_form_error_and_changes_nothing(
    ann_client: Client, people: dict[str, Any], case: str
) -> None:
    values = page(ann_client)
    before = stored(*people.values())
    # Every other field changed too: none of it may be saved.
    values.update(
        {
            "last_seen_visibility": "nobody",
            f"{row_of(values, people['cy'])}-online_visibility": "always",
            "emoji": values["emoji"] or "🙂",
        }
    )
    response = ann_client.post(URL, _bad(values, people, case))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Nothing was saved: please correct what is marked below." in html
    assert 'class="errorlist' in html
    assert stored(*people.values()) == before


@pytest.mark.django_db
def test_the_errors_say_what_is_wrong(ann_client: Client, people: dict[str, Any]) -> None:
    values = page(ann_client)
    for case, message in [
        ("a stranger's row", "This person is not one of your contacts."),
        ("a non-contact's new exception", "eve is not one of your contacts"),
        ("oversize text", "Ensure this value has at most 140 characters (it has 141)."),
        ("unknown level", "Select a valid choice. martians is not one of the available choices."),
    ]:
        html = ann_client.post(URL, _bad(values, people, case)).content.decode()
        assert message in html.replace("&quot;", '"'), case


@pytest.mark.django_db
def test_anonymous_visitors_are_sent_to_the_login_page(
    client: Client, people: dict[str, Any], settings: Any
) -> None:
    settings.LOGIN_URL = "/accounts/login/"  # the demo's: tests/sites/test_demo.py
    before = stored(*people.values())
    for response in (client.get(URL + "?q=b"), client.post(URL, {"status": "invisible"})):
        assert response.status_code == 302
        assert response.url.startswith("/accounts/login/?next=/presence/settings/")
    assert stored(*people.values()) == before


@pytest.mark.django_db
def test_other_methods_are_refused(ann_client: Client) -> None:
    assert ann_client.put(URL).status_code == 405
    assert ann_client.head(URL).status_code == 200


@pytest.mark.django_db
def test_a_post_needs_the_csrf_token(
    people: dict[str, Any], clock: time_machine.Coordinates
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["ann"])
    values = page(client)
    values["online_visibility"] = "nobody"
    before = stored(*people.values())
    forged = {k: v for k, v in values.items() if k != "csrfmiddlewaretoken"}
    assert client.post(URL, forged).status_code == 403
    assert client.post(URL, {**values, "csrfmiddlewaretoken": "x" * 64}).status_code == 403
    assert stored(*people.values()) == before
    assert client.post(URL, values).status_code == 302
    assert PrivacySettings.objects.get(user=people["ann"]).online_visibility == "nobody"


@pytest.mark.django_db
def test_posts_count_against_the_http_rate_limit(
    ann_client: Client, people: dict[str, Any], settings: Any, clock: time_machine.Coordinates
) -> None:
    settings.PRESENCE = {"HTTP_RATE_LIMIT": (3, 60)}  # the clock starts on a whole minute
    ann = people["ann"]
    values = page(ann_client)
    assert ann_client.post(URL, {**values, "text": "one"}).status_code == 302
    # An invalid POST counts too (it costs the same queries), as the JSON endpoints count.
    assert ann_client.post(URL, {**values, "status": "x"}).status_code == 200
    # The JSON endpoint shares the counter.
    ok = ann_client.post(
        "/presence/api/status", {"status": "auto"}, content_type="application/json"
    )
    assert ok.status_code == 200
    clock.shift(15)
    before = stored(ann)
    refused = ann_client.post(URL, {**values, "text": "two", "online_visibility": "nobody"})
    assert refused.status_code == 429 and refused["Retry-After"] == "45"
    html = refused.content.decode()
    assert "try again in 45 seconds. Nothing was saved." in html
    assert 'value="two"' in html  # the form, as posted, to send again
    assert stored(ann) == before
    clock.shift(45)
    assert ann_client.post(URL, {**values, "text": "two"}).status_code == 302
    assert UserStatus.objects.get(user=ann).text == "two"


@pytest.mark.django_db
def test_the_page_speaks_the_users_language(ann_client: Client) -> None:
    html = ann_client.get(URL, headers={"accept-language": "ja"}).content.decode()
    assert '<html lang="ja"' in html
    assert "<h1>プライバシーとステータス</h1>" in html and "誰に何を見せるか" in html
    assert "Privacy and status" not in html and "Who sees what" not in html


# --- open sockets -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_change_on_the_page_reaches_a_viewers_open_socket_at_once(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, other = [await new_user(make_user) for _ in range(3)]
    await lets_see(target, viewer, other)
    client = Client()
    await sync_to_async(quiet_login)(client, target)
    await sockets.open(target)
    watcher, bystander = await sockets.open(viewer), await sockets.open(other)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    assert await subscribe(bystander, target) == state({target.pk: online()})

    async def submit(**changes: str) -> None:
        values = await sync_to_async(page)(client)
        rows = {v: k[: -len("-viewer")] for k, v in values.items() if k.endswith("-viewer")}
        for name, value in changes.items():
            if name.startswith("viewer:"):
                name = f"{rows[str(viewer.pk)]}-{name.removeprefix('viewer:')}"
            values[name] = value
        response = await sync_to_async(client.post)(URL, values)
        assert response.status_code == 302

    await submit(online_visibility="nobody")  # a level
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    assert await receive(bystander) == diff({target.pk: HIDDEN})
    await submit(**{"viewer:online_visibility": "always"})  # an exception for the viewer
    assert await receive(watcher) == diff({target.pk: online()})
    await assert_silent(bystander)
    await submit(text="Lunch", emoji="🥪")  # the custom status, through set_status
    assert await receive(watcher) == diff({target.pk: online(text="Lunch", emoji="🥪")})
    await submit(status="invisible")  # offline to all; the custom status is the level's
    assert await receive(watcher) == diff({target.pk: presence(text="Lunch", emoji="🥪")})
