"""Presence as people read it: "online", "just now", "5 minutes ago"."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils.timesince import timesince
from django.utils.translation import gettext, npgettext_lazy

from presence.domain.model import LAST_SEEN_APPROX_LABELS, Presence

#: timesince's units as presence's own strings: Django's catalogs lack some of them in some
#: languages (vi), which would leave "5 minutes" untranslated inside a translated "... ago".
TIME_STRINGS: dict[str, Any] = {
    "year": npgettext_lazy("last seen", "%(num)d year", "%(num)d years", "num"),
    "month": npgettext_lazy("last seen", "%(num)d month", "%(num)d months", "num"),
    "week": npgettext_lazy("last seen", "%(num)d week", "%(num)d weeks", "num"),
    "day": npgettext_lazy("last seen", "%(num)d day", "%(num)d days", "num"),
    "hour": npgettext_lazy("last seen", "%(num)d hour", "%(num)d hours", "num"),
    "minute": npgettext_lazy("last seen", "%(num)d minute", "%(num)d minutes", "num"),
}


def humanize(presence: Presence, now: datetime) -> str:
    """Say "online", "just now", "5 minutes ago"...; where only the approximate last seen
    shows, "last seen recently", "last seen within a week"... (no number, no time); empty
    when nothing shows."""
    if presence.is_online:
        return gettext("online")
    if presence.last_seen is None:
        approx = presence.last_seen_approx
        return str(LAST_SEEN_APPROX_LABELS[approx]) if approx is not None else ""
    if (now - presence.last_seen).total_seconds() < 60:
        return gettext("just now")
    delta = timesince(presence.last_seen, now, time_strings=TIME_STRINGS, depth=1)
    return gettext("%(delta)s ago") % {"delta": delta}
