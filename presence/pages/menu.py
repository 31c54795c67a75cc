"""The status menu a site puts in its header (``{% presence_status_menu %}``): the settings
page's status form (:class:`presence.pages.forms.StatusForm`: the same fields, choices and
rules), filled in with the viewer's status, in a ``<details>`` that opens a small panel.

With presence.js, presence/status-menu.js saves it through ``window.presence.setStatus`` (over
the socket, else the JSON endpoint) and shows the server's refusal; without JavaScript it is a
plain form posted to the settings page, which saves it and goes back to ``next``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from presence.domain.model import iso_time
from presence.pages.forms import StatusForm

TEMPLATE = "presence/status_menu.html"
#: its inputs' ids: not the settings page's (id_status...), which it may sit beside
AUTO_ID = "presence-status-menu-%s"
#: the clearing choice whose time is the next of a daily one (the next local midnight)
DAILY_CHOICE = "today"


def expiry_options(form: StatusForm) -> list[dict[str, Any]]:
    """The form's clearing choices, each with what the script needs to send ``expires_in``:
    ``seconds`` for a span counted from the save, ``at`` (ISO 8601) for a time ("at midnight",
    as set), neither for never; ``daily`` for a time that comes back each day ("at midnight":
    a page left open past it means the next one, not a time that has passed). The form decides
    which choices there are."""
    field = form["expires"]
    chosen = str(field.value())
    options = []
    for value, label in form.fields["expires"].choices:  # type: ignore[attr-defined]
        when = form.clears(value)
        options.append(
            {
                "value": value,
                "label": label,
                "selected": value == chosen,
                "seconds": int(when.total_seconds()) if isinstance(when, timedelta) else None,
                "at": None if when is None or isinstance(when, timedelta) else iso_time(when),
                "daily": value == DAILY_CHOICE,
            }
        )
    return options


def status_menu(
    request: Any, nonce: str | None = None, template_name: str | None = None
) -> SafeString:
    """The menu for ``request.user``; nothing for an anonymous visitor (or no request)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return SafeString("")
    form = StatusForm(user=user, auto_id=AUTO_ID)
    initial = form.initial
    context = {
        "form": form,
        "custom": " ".join(part for part in (initial["emoji"], initial["text"]) if part),
        "activity": form.activity,
        "expiry_options": expiry_options(form),
        "now": iso_time(form.now),
        # the user's id as presence.js names them: it follows their own presence for the menu
        "own_id": str(user.pk),
        # the zone of the server's times ("as set: ..."), for the script to write a time the same
        "time_zone": timezone.get_current_timezone_name(),
        # the label of a time as set, for the script to name the time a save set ("%(when)s")
        "keep_label": gettext("as set: %(when)s"),
        "next": request.get_full_path(),
        "nonce": nonce,
    }
    return render_to_string(template_name or TEMPLATE, context, request=request)
