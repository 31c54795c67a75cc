"""Presence as people read it: "online", "just now", "5 minutes ago".

presence.js rewrites the last-seen texts as time passes (lastSeenText): it counts by the same
rule (:func:`elapsed`) and writes the same words, which the page gives it
(:func:`script_words`), so that the text the server rendered and the one the script writes
for the same moment are the same.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import translation
from django.utils.html import avoid_wrapping
from django.utils.translation import gettext, npgettext

from presence.domain.model import LAST_SEEN_APPROX_LABELS, Presence

#: the units of a last seen, largest first
UNITS = ("year", "month", "week", "day", "hour", "minute")
#: the units counted in whole seconds, with their length
_SECONDS = (("week", 7 * 86400), ("day", 86400), ("hour", 3600), ("minute", 60))


#: the phrase the units' words go in ("5 minutes ago"), untranslated
AGO = "%(delta)s ago"


def _ago() -> str:
    return gettext("%(delta)s ago")


def speaks_ago() -> bool:
    """Whether the active language's catalogs translate "%(delta)s ago". Only then are the
    units' words theirs: a language presence has no catalog for would find them in Django's
    ("Minuten") and write "5 Minuten ago"; it writes the whole phrase in English instead."""
    return _ago() != AGO


def _catalog_words(unit: str, num: int) -> str:
    if unit == "year":
        return npgettext("last seen", "%(num)d year", "%(num)d years", num)
    if unit == "month":
        return npgettext("last seen", "%(num)d month", "%(num)d months", num)
    if unit == "week":
        return npgettext("last seen", "%(num)d week", "%(num)d weeks", num)
    if unit == "day":
        return npgettext("last seen", "%(num)d day", "%(num)d days", num)
    if unit == "hour":
        return npgettext("last seen", "%(num)d hour", "%(num)d hours", num)
    if unit == "minute":
        return npgettext("last seen", "%(num)d minute", "%(num)d minutes", num)
    raise ValueError(f"no such unit: {unit!r}")


def unit_words(unit: str, num: int) -> str:
    """The words of ``num`` ``unit`` with the number left to fill in (``"%(num)d minutes"``),
    in the active language where it speaks the "... ago" they go in (:func:`speaks_ago`), else
    in English. Presence's own strings: Django's catalogs lack some of them in some languages
    (vi), which would leave "5 minutes" untranslated inside a translated "... ago"."""
    if speaks_ago():
        return _catalog_words(unit, num)
    with translation.override(None):  # no catalog: the English of the strings themselves
        return _catalog_words(unit, num)


class _UnitWords:
    """One unit's words as Django's ``timesince(time_strings=...)`` takes them:
    ``words % {"num": 5}``."""

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def __mod__(self, values: dict[str, int]) -> str:
        return unit_words(self.unit, values["num"]) % values


#: the units' words, for Django's timesince
TIME_STRINGS: dict[str, Any] = {unit: _UnitWords(unit) for unit in UNITS}


def elapsed(since: datetime, now: datetime) -> tuple[str, int] | None:
    """The largest whole unit from ``since`` to ``now``, and how many of it; None under a
    minute. Years and months are counted on the calendar, in UTC: from 31 January, 28
    February is not a month yet, 1 March is (the day of the month and the time of day must be
    reached again; Django's ``timesince`` counts them so); weeks, days, hours and minutes in
    whole seconds. ``since`` counts in whole seconds, as the JSON gives it to presence.js,
    which counts by this same rule."""
    since = since.astimezone(UTC).replace(microsecond=0)
    now = now.astimezone(UTC)
    seconds = (now - since) // timedelta(seconds=1)
    if seconds < 60:
        return None
    months = (now.year - since.year) * 12 + now.month - since.month
    if (now.day, now.time()) < (since.day, since.time()):
        months -= 1
    if months >= 12:
        return "year", months // 12
    if months >= 1:
        return "month", months
    return next((unit, seconds // size) for unit, size in _SECONDS if seconds >= size)


def humanize(presence: Presence, now: datetime) -> str:
    """Say "online", "just now", "5 minutes ago"...; where only the approximate last seen
    shows, "last seen recently", "last seen within a week"... (no number, no time); empty
    when nothing shows."""
    if presence.is_online:
        return gettext("online")
    if presence.last_seen is None:
        approx = presence.last_seen_approx
        return str(LAST_SEEN_APPROX_LABELS[approx]) if approx is not None else ""
    found = elapsed(presence.last_seen, now)
    if found is None:
        return gettext("just now")
    unit, num = found
    # avoid_wrapping: "5 minutes" stays on one line (no-break spaces), as presence.js writes it.
    delta = avoid_wrapping(unit_words(unit, num) % {"num": num})
    return _ago() % {"delta": delta}


#: the numbers of each unit :func:`elapsed` gives, listed for presence.js (years beyond: see
#: :func:`script_words`)
LISTED_UP_TO = {"year": 199, "month": 11, "week": 5, "day": 6, "hour": 23, "minute": 59}


def script_words() -> dict[str, Any]:
    """The words of :func:`humanize` for presence.js, in the active language (the units in
    English where it does not speak "... ago", as :func:`unit_words` writes them): ``ago``
    (``"%(delta)s ago"``) and ``units``, for each unit ``[words, {num: words}]``: its words
    for most numbers, and those of the numbers whose words differ (``{"1": "%(num)d
    minute"}``), each number's plural form as this language's catalog chooses it. Years past
    199 take the words of 100 + their last two digits (plural rules look no further)."""
    ago = _ago()
    units: dict[str, Any] = {}
    # The units in the language of "ago", as humanize() writes them (unit_words).
    with translation.override(None) if ago == AGO else contextlib.nullcontext():
        for unit in UNITS:
            words = {num: _catalog_words(unit, num) for num in range(1, LISTED_UP_TO[unit] + 1)}
            values = list(words.values())
            most = max(dict.fromkeys(values), key=values.count)  # the first, in a tie
            units[unit] = [most, {str(num): text for num, text in words.items() if text != most}]
    return {"ago": ago, "units": units}
