"""Validating a status change and any text a client sends (shared by the JSON endpoint and the
WebSocket): bad input raises :class:`InvalidInput` with one of the contract's error codes."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.utils.translation import gettext

from presence.domain.model import StatusChoice


class InvalidInput(ValueError):
    """Bad input from a client; ``code`` is one of the contract's error codes. ``room``: the
    room (as the client sent it) of the join, leave or room_more frame it answers, which the
    error frame names so that a client can tell it from the answer of another request."""

    def __init__(self, code: str, message: str, *, room: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.room = room


@dataclass(frozen=True, slots=True)
class Limits:
    text_max_length: int
    emoji_max_length: int
    max_expiry: int
    #: longest WebSocket text frame, in bytes of UTF-8
    max_frame_bytes: int = 65536
    #: most user ids one subscribe/unsubscribe frame (and one connection) may name
    max_subscriptions: int = 1000


@dataclass(frozen=True, slots=True)
class StatusChange:
    status: StatusChoice
    text: str | None = None
    emoji: str | None = None
    activity: str | None = None
    expires_in: int | None = None


#: Invisible format characters (Unicode category Cf) that real text and emoji need, so they are
#: allowed: ZERO WIDTH NON-JOINER (Persian, Indic scripts), ZERO WIDTH JOINER (emoji sequences
#: such as "woman technologist", and Indic scripts) and the tag characters U+E0020-E007F of
#: subdivision flags (black flag + tags + CANCEL TAG, e.g. the flag of England). Variation
#: selectors (VS16 in a red heart) and skin tone modifiers are not Cf, so need no exception.
ALLOWED_FORMAT_CHARACTERS = frozenset(
    ["\u200c", "\u200d", *(chr(code) for code in range(0xE0020, 0xE0080))]
)
#: control characters a multi-line text (a post) may contain
_LINE_CONTROLS = frozenset("\n\t")


def check_text(value: str, name: str, *, multiline: bool = False) -> str:
    """Refuse text that cannot be stored or would mislead readers; return it unchanged.

    The one rule for every text a client sends (status text, emoji and activity, posts, search
    and mention queries, usernames in URLs). Raises InvalidInput ``invalid_value`` for:

    - lone surrogates (not Unicode text: no database can store them as UTF-8);
    - control characters (category Cc, NUL included: PostgreSQL refuses NUL in text), except
      line breaks and tabs when ``multiline``;
    - invisible format characters (category Cf) such as RIGHT-TO-LEFT OVERRIDE, which can make
      text read differently from what it is, except :data:`ALLOWED_FORMAT_CHARACTERS`.
    """
    for ch in value:
        category = unicodedata.category(ch)
        if category == "Cs":
            raise InvalidInput(
                "invalid_value",
                gettext("'%(field)s' is not valid Unicode text (a lone surrogate).")
                % {"field": name},
            )
        if (category == "Cc" and not (multiline and ch in _LINE_CONTROLS)) or (
            category == "Cf" and ch not in ALLOWED_FORMAT_CHARACTERS
        ):
            raise InvalidInput(
                "invalid_value",
                gettext("'%(field)s' must not contain control characters.") % {"field": name},
            )
    return value


def _optional_text(data: Mapping[str, Any], name: str, max_length: int) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(
            "invalid_message", gettext("'%(field)s' must be a string or null.") % {"field": name}
        )
    value = check_text(value.strip(), name)
    if len(value) > max_length:
        raise InvalidInput(
            "invalid_value",
            gettext("'%(field)s' is %(length)d characters long; at most %(limit)d.")
            % {"field": name, "length": len(value), "limit": max_length},
        )
    return value or None


def parse_status_change(data: Any, limits: Limits) -> StatusChange:
    if not isinstance(data, Mapping):
        raise InvalidInput("invalid_message", gettext("Expected a JSON object."))
    status = data.get("status")
    if not isinstance(status, str):
        raise InvalidInput(
            "invalid_message", gettext("'status' is required: one of 'auto', 'dnd', 'invisible'.")
        )
    try:
        choice = StatusChoice(status)
    except ValueError:
        raise InvalidInput(
            "invalid_value",
            gettext("Unknown status %(status)s: use 'auto', 'dnd' or 'invisible'.")
            % {"status": repr(status)[:60]},
        ) from None
    expires_in = data.get("expires_in")
    if expires_in is not None:
        if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
            raise InvalidInput(
                "invalid_message", gettext("'expires_in' must be a number of seconds or null.")
            )
        if not 1 <= expires_in <= limits.max_expiry:
            raise InvalidInput(
                "invalid_value",
                gettext("'expires_in' must be between 1 and %(limit)d seconds.")
                % {"limit": limits.max_expiry},
            )
        expires_in = int(expires_in)
    return StatusChange(
        status=choice,
        text=_optional_text(data, "text", limits.text_max_length),
        emoji=_optional_text(data, "emoji", limits.emoji_max_length),
        activity=_optional_text(data, "activity", limits.text_max_length),
        expires_in=expires_in,
    )
