"""The admin of per-person exceptions: an inline on the user's privacy settings (saved like any
row, so open sockets see it), and their own list, searchable by either user."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from django.test import Client

from presence import announce
from presence.models import PrivacyException, PrivacySettings
from tests.core.test_admin import form_values

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]

PREFIX = "presence_privacy_exceptions"


@pytest.fixture
def admin_client(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def test_the_inline_on_the_privacy_settings_adds_and_removes_exceptions(
    admin_client: Client, make_user: Callable[..., Any], django_capture_on_commit_callbacks: Any
) -> None:
    owner, viewer = make_user("ann"), make_user("ben")
    settings_row = PrivacySettings.objects.create(user=owner, last_seen_visibility="nobody")
    url = f"/admin/presence/privacysettings/{settings_row.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    values = form_values(page.content.decode())
    assert f"{PREFIX}-TOTAL_FORMS" in values
    values.update(
        {
            f"{PREFIX}-0-viewer": str(viewer.pk),
            f"{PREFIX}-0-setting": "last_seen_visibility",
            f"{PREFIX}-0-allow": "on",
        }
    )
    with (
        mock.patch.object(announce, "changed") as changed,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = admin_client.post(url, values)
    assert response.status_code == 302, response.content.decode()[:2000]
    row = PrivacyException.objects.get()
    assert (row.owner, row.viewer, row.setting, row.allow) == (
        owner,
        viewer,
        "last_seen_visibility",
        True,
    )
    # Saved like any row: announced on the route of a privacy change, open sockets re-read.
    assert any(call.args[1] == "privacy" for call in changed.call_args_list)
    # ... and removed from the same page.
    values = form_values(admin_client.get(url).content.decode())
    values[f"{PREFIX}-0-DELETE"] = "on"
    assert admin_client.post(url, values).status_code == 302
    assert not PrivacyException.objects.exists()


def test_the_exceptions_list_searches_by_either_user(
    admin_client: Client, make_user: Callable[..., Any]
) -> None:
    ann, ben, cy = make_user("ann"), make_user("ben"), make_user("cy")
    PrivacyException.objects.create(owner=ann, viewer=ben, setting="online_visibility")
    PrivacyException.objects.create(owner=cy, viewer=ann, setting="activity_visibility")
    url = "/admin/presence/privacyexception/"
    assert admin_client.get(url).status_code == 200
    assert admin_client.get("/admin/presence/privacysettings/add/").status_code == 200
    by_owner = admin_client.get(url, {"q": "cy"}).content.decode()
    assert "activity_visibility" in by_owner or "custom status" in by_owner
    assert admin_client.get(url, {"q": "ben"}).context["cl"].result_count == 1
    assert admin_client.get(url, {"q": "ann"}).context["cl"].result_count == 2


def _add_page_values(admin_client: Client, owner: Any, viewer: Any) -> dict[str, Any]:
    """The add page of privacy settings for ``owner``, as a browser submits it, with one
    exception naming ``viewer``."""
    values = form_values(admin_client.get("/admin/presence/privacysettings/add/").content.decode())
    values.update(
        {
            "user": str(owner.pk),
            f"{PREFIX}-0-viewer": str(viewer.pk),
            f"{PREFIX}-0-setting": "online_visibility",
            f"{PREFIX}-0-allow": "on",
        }
    )
    return values


def test_the_add_page_of_privacy_settings_saves_its_exceptions(
    admin_client: Client, make_user: Callable[..., Any]
) -> None:
    owner, viewer = make_user("ann"), make_user("ben")
    values = _add_page_values(admin_client, owner, viewer)
    values["online_visibility"] = "nobody"
    response = admin_client.post("/admin/presence/privacysettings/add/", values)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert PrivacySettings.objects.get(user=owner).online_visibility == "nobody"
    row = PrivacyException.objects.get()
    assert (row.owner, row.viewer, row.setting, row.allow) == (
        owner,
        viewer,
        "online_visibility",
        True,
    )


def test_the_add_page_refuses_an_exception_the_user_already_has(
    admin_client: Client, make_user: Callable[..., Any]
) -> None:
    # Exceptions belong to the user, who may have some before any privacy settings row.
    owner, viewer = make_user("ann"), make_user("ben")
    PrivacyException.objects.create(owner=owner, viewer=viewer, setting="online_visibility")
    values = _add_page_values(admin_client, owner, viewer)
    response = admin_client.post("/admin/presence/privacysettings/add/", values)
    assert response.status_code == 200
    assert "already exists" in response.content.decode()
    assert not PrivacySettings.objects.exists()
    assert PrivacyException.objects.count() == 1


ONESELF = "the viewer cannot be the owner"


def test_an_exception_for_oneself_is_a_form_error(
    admin_client: Client, make_user: Callable[..., Any]
) -> None:
    """The database refuses it (a CHECK constraint): the inline, on the change and add pages,
    and the exceptions' own admin say why instead."""
    owner = make_user("ann")
    settings_row = PrivacySettings.objects.create(user=owner)
    change = f"/admin/presence/privacysettings/{settings_row.pk}/change/"
    values = form_values(admin_client.get(change).content.decode())
    values.update({f"{PREFIX}-0-viewer": str(owner.pk), f"{PREFIX}-0-setting": "online_visibility"})
    on_the_change_page = admin_client.post(change, values)
    assert on_the_change_page.status_code == 200
    assert ONESELF in on_the_change_page.content.decode()
    settings_row.delete()
    on_the_add_page = admin_client.post(
        "/admin/presence/privacysettings/add/", _add_page_values(admin_client, owner, owner)
    )
    assert on_the_add_page.status_code == 200
    assert ONESELF in on_the_add_page.content.decode()
    assert not PrivacySettings.objects.exists()
    standalone = admin_client.post(
        "/admin/presence/privacyexception/add/",
        {"owner": owner.pk, "viewer": owner.pk, "setting": "online_visibility"},
    )
    assert standalone.status_code == 200
    assert ONESELF in standalone.content.decode()
    assert not PrivacyException.objects.exists()
