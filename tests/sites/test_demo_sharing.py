"""The demo's "always share with" / "never share with" pickers (issue 26)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from presence import api
from presence.models import PrivacyException
from tests.sites.test_demo import demo as demo
from tests.sites.test_demo import login

pytestmark = pytest.mark.django_db


def test_the_pickers_save_exceptions_that_apply(client: Any, demo: dict[str, Any]) -> None:
    alice, bob, erin = demo["alice"], demo["bob"], demo["erin"]
    api.touch(alice)
    assert api.get_presence(alice, erin).status == "offline"  # erin is not alice's contact
    login(client, alice)
    page = client.get(reverse("demo:privacy"))
    assert "always_online_visibility" in page.content.decode()
    response = client.post(
        reverse("demo:sharing"),
        {"always_online_visibility": [erin.pk], "never_last_seen_visibility": [bob.pk]},
    )
    assert response.status_code == 302
    assert api.get_presence(alice, erin).status == "online"
    assert api.get_presence(alice, bob).last_seen is None
    # Nothing before today is known of alice: not even the approximate last seen.
    assert api.get_presence(alice, bob).last_seen_approx is None
    # The page shows them chosen; saving nothing removes them.
    form = client.get(reverse("demo:privacy")).context["sharing"]
    assert list(form["always_online_visibility"].value()) == [erin.pk]
    assert client.post(reverse("demo:sharing"), {}).status_code == 302
    assert not PrivacyException.objects.filter(owner=alice).exists()


def test_one_person_in_both_lists_is_refused(client: Any, demo: dict[str, Any]) -> None:
    alice, bob = demo["alice"], demo["bob"]
    login(client, alice)
    response = client.post(
        reverse("demo:sharing"),
        {"always_activity_visibility": [bob.pk], "never_activity_visibility": [bob.pk]},
    )
    assert response.status_code == 400
    assert "cannot be in both lists" in response.content.decode()
    assert not PrivacyException.objects.exists()
