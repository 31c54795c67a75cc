"""Presence's model of a user: statuses, devices, what Redis and the database report, and the
presence a viewer is shown. Plain values, no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeAlias
from uuid import UUID

from django.utils.translation import gettext_lazy as _

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
    #: the last activity before ``last_active``'s UTC day (kept by the writes when a new day's
    #: activity replaces it): the approximate last seen counts from it until midnight
    prior: float | None = None


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
    #: the database's last seen of a UTC day before ``persisted_last_seen``'s (the one a write
    #: of a later day replaced, LastSeen.prior_seen_at): the approximate last seen counts from
    #: it until midnight, even once Redis has forgotten the user
    persisted_prior: float | None = None


#: the visibility settings of a user's choices (and of PrivacySettings), each a Visibility
VISIBILITY_SETTINGS = ("online_visibility", "last_seen_visibility", "activity_visibility")

#: A target's exceptions for one viewer (PrivacyException rows), packed in a small int: two
#: bits per visibility setting, "always share" and "never share" (a row is one or the other).
EXCEPTION_SHIFT = {"online_visibility": 0, "last_seen_visibility": 2, "activity_visibility": 4}
EXCEPTION_ALLOW = 1
EXCEPTION_DENY = 2
#: the bits of every setting's exceptions (the reverse direction is packed above them)
EXCEPTION_BITS = 6


def exception_bits(setting: str, allow: bool) -> int:
    """The bit of one exception (``allow``: "always share", else "never share")."""
    return (EXCEPTION_ALLOW if allow else EXCEPTION_DENY) << EXCEPTION_SHIFT[setting]


class LastSeenApprox(StrEnum):
    """How long ago, in whole UTC days, for viewers who may not see the exact last seen."""

    RECENTLY = "recently"  # 0-2 days
    WITHIN_WEEK = "within_week"  # 3-6
    WITHIN_MONTH = "within_month"  # 7-29
    LONG_AGO = "long_ago"  # 30+


LAST_SEEN_APPROX_LABELS = {
    LastSeenApprox.RECENTLY: _("last seen recently"),
    LastSeenApprox.WITHIN_WEEK: _("last seen within a week"),
    LastSeenApprox.WITHIN_MONTH: _("last seen within a month"),
    LastSeenApprox.LONG_AGO: _("last seen a long time ago"),
}
_LEVELS = frozenset(level.value for level in Visibility)


def default_choices(levels: Mapping[str, Any]) -> Choices:
    """The choices of a user who made none (no PrivacySettings row): ``levels`` (the site's
    DEFAULT_PRIVACY) by visibility setting, "contacts" for a setting it leaves out or gives no
    level of :class:`Visibility` (presence.E010 reports those)."""

    def level(name: str) -> Visibility:
        value = levels.get(name)
        return (
            Visibility(value)
            if isinstance(value, str) and value in _LEVELS
            else Visibility.CONTACTS
        )

    return Choices(
        online_visibility=level("online_visibility"),
        last_seen_visibility=level("last_seen_visibility"),
        activity_visibility=level("activity_visibility"),
    )


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
    #: the target's exceptions for this viewer (:func:`exception_bits`, or-ed)
    exceptions: int = 0
    #: the viewer hides their own exact last seen from the target (RECIPROCAL_LAST_SEEN), so
    #: sees only the target's approximate last seen
    hides_own_last_seen: bool = False


SELF = Relation(is_self=True)
STRANGER = Relation()


@dataclass(frozen=True, slots=True)
class Timing:
    online_window: float
    offline_grace: float
    connection_ttl: float = 90
    #: APPROXIMATE_LAST_SEEN: viewers who may not see last seen get ``last_seen_approx``
    approximate_last_seen: bool = True


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
    #: where last_seen is hidden (and no block): how long ago, to the UTC day
    last_seen_approx: LastSeenApprox | None = None
    #: in a user's own presence only: when their custom status clears (None: never, or none)
    expires_at: datetime | None = None

    @property
    def is_online(self) -> bool:
        return self.status is not Status.OFFLINE

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": self.status.value,
            "last_seen": iso_time(self.last_seen),
            "last_seen_approx": approx.value if (approx := self.last_seen_approx) else None,
            "devices": list(self.devices),
            "text": self.text,
            "emoji": self.emoji,
            "activity": self.activity,
        }
        if self.invisible is not None:
            data["invisible"] = self.invisible
        if self.expires_at is not None:
            data["expires_at"] = iso_time(self.expires_at)
        return data


HIDDEN = Presence()


def iso_time(value: datetime | None) -> str | None:
    """The one format of times in presence's JSON: ISO 8601 in UTC to the second
    ("2025-01-31T09:30:00+00:00"), whichever path the time came from (Redis keeps seconds, the
    database microseconds)."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="seconds")
