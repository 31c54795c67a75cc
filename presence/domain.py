"""The rules of presence, free of I/O: statuses, device aggregation, privacy, humanized times.

Everything that decides what a viewer may see lives here, in :func:`resolve`; the store reports
facts, the relations loader reports who is whose contact, and every read path (Python API,
template tags, JSON endpoint, WebSocket) hands both to :func:`resolve`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from functools import cache
from typing import Any, TypeAlias
from uuid import UUID

from django.utils.timesince import timesince
from django.utils.translation import gettext, npgettext_lazy
from django.utils.translation import gettext_lazy as _

from presence.memo import bounded_memo

#: a user's primary key, in the type of the site's user model's pk (an integer, a UUID or a
#: string; presence.users converts what clients send)
UserId: TypeAlias = int | str | UUID


class Status(StrEnum):
    ONLINE = "online"
    IDLE = "idle"
    DND = "dnd"
    OFFLINE = "offline"


#: Across devices the most present wins: an explicit dnd on any device wins.

STATUS_LABELS = {
    Status.ONLINE: _("Online"),
    Status.IDLE: _("Idle"),
    Status.DND: _("Do not disturb"),
    Status.OFFLINE: _("Offline"),
}


class Visibility(StrEnum):
    EVERYONE = "everyone"
    CONTACTS = "contacts"
    CLOSE_FRIENDS = "close_friends"
    NOBODY = "nobody"


VISIBILITY_LABELS = {
    Visibility.EVERYONE: _("Everyone"),
    Visibility.CONTACTS: _("My contacts"),
    Visibility.CLOSE_FRIENDS: _("Close friends"),
    Visibility.NOBODY: _("Nobody"),
}


class StatusChoice(StrEnum):
    """What a user asks for with ``set_status``."""

    AUTO = "auto"
    DND = "dnd"
    INVISIBLE = "invisible"


class Device(StrEnum):
    WEB = "web"
    MOBILE = "mobile"
    DESKTOP = "desktop"


#: One bit per device kind; the store keeps the set of kinds as a small bit mask.
DEVICE_BITS = {Device.WEB: 1, Device.MOBILE: 2, Device.DESKTOP: 4}
DEVICE_MASK_LIMIT = 8

_MOBILE_UA = re.compile(r"Mobi|Android|iPhone|iPad|iPod|Windows Phone", re.IGNORECASE)
_DESKTOP_UA = re.compile(r"Electron|Tauri", re.IGNORECASE)


def device_from_user_agent(user_agent: str | None) -> Device:
    if user_agent:
        if _DESKTOP_UA.search(user_agent):
            return Device.DESKTOP
        if _MOBILE_UA.search(user_agent):
            return Device.MOBILE
    return Device.WEB


def _devices_of(mask: int) -> tuple[Device, ...]:
    return tuple(device for device, bit in DEVICE_BITS.items() if mask & bit)


#: Every mask's devices, computed once: decoding is on the path of every read.
_DEVICES_BY_MASK = tuple(_devices_of(mask) for mask in range(DEVICE_MASK_LIMIT))


def devices_from_mask(mask: int) -> tuple[Device, ...]:
    return _DEVICES_BY_MASK[mask]


def devices_to_mask(devices: Iterable[Device]) -> int:
    mask = 0
    for device in devices:
        mask |= DEVICE_BITS[device]
    return mask


@dataclass(frozen=True, slots=True)
class LiveState:
    """What Redis knows about a user right now (all times are epoch seconds)."""

    last_active: float | None = None
    devices: tuple[Device, ...] = ()
    #: the user went offline explicitly (logout, last connection closed) at ``last_active``;
    #: ``devices`` and ``idle`` then describe the moment before, shown during the grace
    signed_off: bool = False
    #: the user has live WebSocket connections: ``last_active`` is their latest heartbeat and
    #: liveness is judged by CONNECTION_TTL (crash detection) instead of ONLINE_WINDOW
    connected: bool = False
    #: every live connection reported no input for IDLE_AFTER (or a hidden tab)
    idle: bool = False


@dataclass(frozen=True, slots=True)
class Choices:
    """A target's own choices, from the database: privacy settings and custom status."""

    online_visibility: Visibility = Visibility.CONTACTS
    last_seen_visibility: Visibility = Visibility.CONTACTS
    activity_visibility: Visibility = Visibility.CONTACTS
    invisible: bool = False
    dnd: bool = False
    text: str | None = None
    emoji: str | None = None
    activity: str | None = None
    #: when text, emoji and activity clear (epoch seconds), or None for never
    expires_at: float | None = None
    #: last seen persisted in the database (survives a Redis flush)
    persisted_last_seen: float | None = None


@dataclass(frozen=True, slots=True)
class Relation:
    """How a target relates to a viewer. The default is a stranger (or an anonymous viewer)."""

    is_self: bool = False
    #: the target has the viewer among its contacts
    is_contact: bool = False
    #: the target marked the viewer a close friend
    is_close_friend: bool = False
    #: a block in either direction
    blocked: bool = False


SELF = Relation(is_self=True)
STRANGER = Relation()


@dataclass(frozen=True, slots=True)
class Timing:
    online_window: float
    offline_grace: float
    connection_ttl: float = 90


@dataclass(frozen=True, slots=True)
class Presence:
    status: Status = Status.OFFLINE
    last_seen: datetime | None = None
    devices: tuple[str, ...] = ()
    text: str | None = None
    emoji: str | None = None
    activity: str | None = None
    #: only present in a user's own presence
    invisible: bool | None = field(default=None)

    @property
    def is_online(self) -> bool:
        return self.status is not Status.OFFLINE

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": self.status.value,
            "last_seen": iso_time(self.last_seen),
            "devices": list(self.devices),
            "text": self.text,
            "emoji": self.emoji,
            "activity": self.activity,
        }
        if self.invisible is not None:
            data["invisible"] = self.invisible
        return data


HIDDEN = Presence()


def iso_time(value: datetime | None) -> str | None:
    """The one format of times in presence's JSON: ISO 8601 in UTC to the second
    ("2025-01-31T09:30:00+00:00"), whichever path the time came from (Redis keeps seconds, the
    database microseconds)."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="seconds")


def visibly_differs(before: Presence | None, after: Presence) -> bool:
    """Whether a viewer who was shown ``before`` must be told ``after``.

    While a user stays online their last seen is "about now" and moves with every heartbeat;
    that alone is no news, so it is compared only when the user is (or goes) offline.
    """
    if before is None or before is after:
        return before is None
    if before.is_online and after.is_online:
        # Every field but last_seen (without building two copies: the hub asks this per viewer).
        return (
            before.status,
            before.devices,
            before.text,
            before.emoji,
            before.activity,
            before.invisible,
        ) != (after.status, after.devices, after.text, after.emoji, after.activity, after.invisible)
    return before != after


def permits(level: Visibility, relation: Relation) -> bool:
    if relation.is_self:
        return True
    if relation.blocked:
        return False
    if level is Visibility.EVERYONE:
        return True
    if level is Visibility.CONTACTS:
        return relation.is_contact
    if level is Visibility.CLOSE_FRIENDS:
        return relation.is_contact and relation.is_close_friend
    return False


#: Redis keeps whole seconds (``int(now)``), so an event is known only to its second. The grace
#: and the TTL count from the END of that second, so neither is ever cut short (a close at
#: 100.9 is offline at 101 + grace, not at 100 + grace); page views' ONLINE_WINDOW, long and
#: not a promise to the second, counts from its start (docs/settings.md).
SECOND = 1


def offline_at(live: LiveState, timing: Timing) -> float | None:
    """When the user turns offline if nothing else happens (None: never online)."""
    if live.last_active is None:
        return None
    if live.signed_off:
        return live.last_active + SECOND + timing.offline_grace
    if live.connected:
        return live.last_active + SECOND + timing.connection_ttl
    return live.last_active + timing.online_window


def live_status(live: LiveState, now: float, timing: Timing) -> Status:
    """Online, idle or offline from activity and connections (dnd is a choice, see resolve)."""
    deadline = offline_at(live, timing)
    if deadline is None or now >= deadline:
        return Status.OFFLINE
    return Status.IDLE if live.idle else Status.ONLINE


def live_news(
    before: LiveState, after: LiveState, now: float, timing: Timing, until: float | None = None
) -> bool:
    """Whether a write changed the user's status or devices, as opposed to only moving their
    last activity forward (a heartbeat that changes nothing is no news).

    ``now`` is when the write was made, ``until`` (if later) when it was known done: a reader
    in between may have seen ``before`` turn offline (a heartbeat that came just after the
    connection's TTL), and nobody else tells that reader the user is back. A difference at
    either instant is news."""

    def view(state: LiveState, at: float) -> tuple[Status, tuple[Device, ...]]:
        status = live_status(state, at, timing)
        return status, (state.devices if status is not Status.OFFLINE else ())

    if view(before, now) != view(after, now):
        return True
    return until is not None and until > now and view(before, until) != view(after, until)


def _timestamp(value: float | None) -> datetime | None:
    return _datetime_at(value) if value is not None else None


# Last-active times are whole seconds, shared by many users read at once (datetimes are
# immutable: one instance serves them all).
@bounded_memo(8192)
def _datetime_at(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


@cache
def _device_names(devices: tuple[Device, ...]) -> tuple[str, ...]:
    # A handful of distinct tuples: resolving thousands of users builds none.
    return tuple(device.value for device in devices)


def resolve(
    live: LiveState, choices: Choices, relation: Relation, now: float, timing: Timing
) -> Presence:
    """What ``relation``'s viewer may see of a target. The one privacy resolver.

    On the path of every read, thousands of users at a time (``online_friends``): it builds
    one Presence and nothing else."""
    if relation.blocked and not relation.is_self:
        return HIDDEN

    true_status = live_status(live, now, timing)
    if true_status is not Status.OFFLINE and choices.dnd:
        true_status = Status.DND
    last_seen_ts = live.last_active
    persisted = choices.persisted_last_seen
    if persisted is not None and (last_seen_ts is None or persisted > last_seen_ts):
        last_seen_ts = persisted
    expires_at = choices.expires_at
    if (expires_at is None or expires_at > now) and permits(choices.activity_visibility, relation):
        text, emoji, activity = choices.text, choices.emoji, choices.activity
    else:
        text = emoji = activity = None
    if relation.is_self:
        online = true_status is not Status.OFFLINE
        return Presence(
            status=true_status,
            last_seen=_timestamp(last_seen_ts),
            devices=_device_names(live.devices) if online else (),
            text=text,
            emoji=emoji,
            activity=activity,
            invisible=choices.invisible,
        )

    # Invisible looks exactly like offline with last seen hidden.
    show_online = not choices.invisible and permits(choices.online_visibility, relation)
    # A fresh last seen would reveal being online, so it needs both permissions.
    show_last_seen = show_online and permits(choices.last_seen_visibility, relation)
    status = true_status if show_online else Status.OFFLINE
    return Presence(
        status=status,
        last_seen=_timestamp(last_seen_ts) if show_last_seen else None,
        devices=_device_names(live.devices) if status is not Status.OFFLINE else (),
        text=text,
        emoji=emoji,
        activity=activity,
    )


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
    """Say "online", "just now", "5 minutes ago"...; empty when last seen is hidden."""
    if presence.is_online:
        return gettext("online")
    if presence.last_seen is None:
        return ""
    if (now - presence.last_seen).total_seconds() < 60:
        return gettext("just now")
    delta = timesince(presence.last_seen, now, time_strings=TIME_STRINGS, depth=1)
    return gettext("%(delta)s ago") % {"delta": delta}


# --- validating a status change (shared by the JSON endpoint and the WebSocket) ---


class InvalidInput(ValueError):
    """Bad input from a client; ``code`` is one of the contract's error codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


# --- validating WebSocket frames (the consumer's whole input surface, kept pure) ---


class HeartbeatState(StrEnum):
    ACTIVE = "active"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    state: HeartbeatState = HeartbeatState.ACTIVE


@dataclass(frozen=True, slots=True)
class Subscribe:
    #: ids as the client sent them (JSON numbers or strings); the consumer reads them as the
    #: site's pk (presence.users.parse_user_id) and echoes them back as sent
    users: tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    users: tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class SetStatus:
    change: StatusChange


@dataclass(frozen=True, slots=True)
class Extension:
    """A frame of a type an installed app added (presence.extensions): its type, and what the
    app's parser made of it."""

    type: str
    message: Any


ClientMessage = Heartbeat | Subscribe | Unsubscribe | SetStatus | Extension

CLIENT_TYPES = (
    "heartbeat",
    "subscribe",
    "unsubscribe",
    "set_status",
)


#: the largest id a database integer key holds (BigAutoField; SQLite's INTEGER): a larger one
#: names no user, and SQLite cannot even be asked about it (OverflowError)
MAX_USER_ID = 2**63 - 1
#: longest id a client may send as a string (whatever the pk, longer names no user)
MAX_USER_ID_LENGTH = 255


def _user_ids(data: Mapping[str, Any], limits: Limits) -> tuple[int | str, ...]:
    """The ids of a subscribe/unsubscribe as sent: numbers (positive integers) or strings (what
    they must look like depends on the site's pk; the consumer checks that)."""
    users = data.get("users")
    if not isinstance(users, list) or not all(
        isinstance(user, int | str) and not isinstance(user, bool) for user in users
    ):
        raise InvalidInput(
            "invalid_message",
            gettext("'users' must be a list of user ids (numbers or strings)."),
        )
    if any(isinstance(user, int) and not 1 <= user <= MAX_USER_ID for user in users):
        raise InvalidInput("invalid_value", gettext("User ids are positive integers."))
    if any(isinstance(user, str) and not 0 < len(user) <= MAX_USER_ID_LENGTH for user in users):
        raise InvalidInput(
            "invalid_value",
            gettext("A user id is a non-empty string of at most %(limit)d characters.")
            % {"limit": MAX_USER_ID_LENGTH},
        )
    unique = tuple(dict.fromkeys(users))
    if len(unique) > limits.max_subscriptions:
        raise InvalidInput(
            "too_many_subscriptions",
            gettext("%(count)d user ids in one frame; at most %(limit)d.")
            % {"count": len(unique), "limit": limits.max_subscriptions},
        )
    return unique


def parse_frame(
    text: str | None,
    limits: Limits,
    extra: Mapping[str, Callable[[Mapping[str, Any]], Any]] | None = None,
) -> ClientMessage:
    """One client frame as a message, or InvalidInput naming the problem (contract codes, plus
    ``frame_too_large``). ``extra`` parses the types installed apps added (type -> parser,
    see presence.extensions); presence's own types come first."""
    if text is None:
        raise InvalidInput("invalid_message", gettext("Send JSON text frames, not binary ones."))
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_frame_bytes:
        raise InvalidInput(
            "frame_too_large",
            gettext("The frame is %(size)d bytes long; at most %(limit)d.")
            % {"size": size, "limit": limits.max_frame_bytes},
        )
    try:
        data = json.loads(text)
    except ValueError:
        raise InvalidInput("invalid_json", gettext("The frame is not valid JSON.")) from None
    except RecursionError:
        # Valid JSON nested deeper than the parser's recursion limit (1 KB of "[" suffices):
        # no frame of the protocol nests more than two levels.
        raise InvalidInput(
            "invalid_message", gettext("The frame nests arrays or objects too deeply.")
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput("invalid_message", gettext("Expected a JSON object."))
    kind = data.get("type")
    if not isinstance(kind, str):
        raise InvalidInput("invalid_message", gettext("'type' is required and must be a string."))
    if kind == "heartbeat":
        state = data.get("state", HeartbeatState.ACTIVE.value)
        if not isinstance(state, str):
            raise InvalidInput("invalid_message", gettext("'state' must be 'active' or 'idle'."))
        try:
            return Heartbeat(HeartbeatState(state))
        except ValueError:
            raise InvalidInput(
                "invalid_value",
                gettext("Unknown state %(state)s: use 'active' or 'idle'.")
                % {"state": repr(state)[:60]},
            ) from None
    if kind == "subscribe":
        return Subscribe(_user_ids(data, limits))
    if kind == "unsubscribe":
        return Unsubscribe(_user_ids(data, limits))
    if kind == "set_status":
        return SetStatus(parse_status_change(data, limits))
    if extra and kind in extra:
        return Extension(kind, extra[kind](data))
    raise InvalidInput(
        "unknown_type",
        gettext("Unknown message type %(type)s: use one of %(types)s.")
        % {"type": repr(kind)[:60], "types": ", ".join([*CLIENT_TYPES, *(extra or ())])},
    )
