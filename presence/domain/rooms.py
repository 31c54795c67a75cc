"""Rooms, as pure rules: a room's name, a member's meta, and who a viewer is shown in a room.

A room is ``kind:id`` (``post:42``): the kind is one the site declares (``ROOMS``), the id is
1-64 printable characters without spaces. What a viewer sees of a room:

- **listed**: the viewer (if in the room) and members whose online status the viewer may see
  (the one resolver decides: :func:`is_listed`), at most ``ROOM_LIST_LIMIT``, the viewer
  first, then the viewer's contacts, then by join time (:func:`order_listed`);
- **others**: members present but not listed (hidden from the viewer, or past the limit);
- neither listed nor counted: invisible members and members blocked either way
  (:func:`is_counted`). ``count`` = listed + others.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.utils.translation import gettext

from presence.domain.model import Presence, Relation, UserId
from presence.domain.validation import InvalidInput

#: a room kind: a lowercase letter, then lowercase letters, digits, ``_`` and ``-``
KIND_PATTERN = re.compile(r"[a-z][a-z0-9_-]*")
#: longest kind, in characters
MAX_KIND_LENGTH = 32
#: longest room id, in characters
MAX_ROOM_ID_LENGTH = 64
#: largest meta of one connection in a room: its compact JSON, in bytes of UTF-8
MAX_META_BYTES = 512


@dataclass(frozen=True, slots=True)
class Room:
    kind: str
    id: str

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.id}"

    def __str__(self) -> str:
        return self.name


def _bad_room(value: Any) -> InvalidInput:
    return InvalidInput(
        "invalid_value",
        gettext(
            "%(room)s is not a room name: use kind:id, where the kind is a lowercase letter "
            "followed by lowercase letters, digits, _ or - (at most %(kind)d), and the id is "
            "1-%(id)d printable characters without spaces."
        )
        % {"room": repr(value)[:80], "kind": MAX_KIND_LENGTH, "id": MAX_ROOM_ID_LENGTH},
    )


def is_valid_kind(kind: Any) -> bool:
    return (
        isinstance(kind, str)
        and len(kind) <= MAX_KIND_LENGTH
        and KIND_PATTERN.fullmatch(kind) is not None
    )


def _is_valid_id(room_id: str) -> bool:
    # isprintable() refuses control characters, lone surrogates and most invisible format
    # characters; isspace() the spaces isprintable() lets through.
    return 0 < len(room_id) <= MAX_ROOM_ID_LENGTH and all(
        char.isprintable() and not char.isspace() for char in room_id
    )


def parse_room(value: Any, room_id: Any = None) -> Room:
    """A room from ``"kind:id"``, from ``(kind, id)``, or from two arguments ``kind, id`` (an
    integer id is its decimal text); InvalidInput ``invalid_value`` otherwise."""
    if room_id is not None:
        value = (value, room_id)
    if isinstance(value, Room):
        return value
    if isinstance(value, str):
        kind, colon, rest = value.partition(":")
        if not colon:
            raise _bad_room(value)
    elif isinstance(value, tuple | list) and len(value) == 2:
        kind, rest = value
        if isinstance(rest, int) and not isinstance(rest, bool):
            rest = str(rest)
    else:
        raise _bad_room(value)
    if not (is_valid_kind(kind) and isinstance(rest, str) and _is_valid_id(rest)):
        raise _bad_room(value)
    return Room(kind, rest)


def _is_json_but_for_non_finite_numbers(value: Any) -> bool:
    """Whether ``value``, refused as JSON, would be JSON but for an infinite or NaN number."""
    try:
        # allow_nan: those numbers alone let through
        json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def parse_meta(value: Any) -> str | None:
    """A member's meta as its compact JSON text (None for null): a JSON object of at most
    MAX_META_BYTES bytes, without lone surrogates; InvalidInput otherwise."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput("invalid_message", gettext("'meta' must be a JSON object or null."))
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(text.encode("utf-8"))
    except (ValueError, TypeError, RecursionError):  # a lone surrogate, NaN, not JSON
        if _is_json_but_for_non_finite_numbers(value):  # 1e400 is valid JSON, read as inf
            raise InvalidInput(
                "invalid_value",
                gettext("'meta' holds a number out of range (such as 1e400) or NaN."),
            ) from None
        raise InvalidInput(
            "invalid_value", gettext("'meta' must be valid JSON text without lone surrogates.")
        ) from None
    if size > MAX_META_BYTES:
        raise InvalidInput(
            "invalid_value",
            gettext("'meta' is %(size)d bytes of JSON; at most %(limit)d.")
            % {"size": size, "limit": MAX_META_BYTES},
        )
    return text


def is_counted(relation: Relation, invisible: bool) -> bool:
    """Whether a present member counts for this viewer at all: not invisible (unless it is
    the viewer), not blocked either way."""
    return relation.is_self or not (invisible or relation.blocked)


def is_listed(relation: Relation, presence: Presence) -> bool:
    """Whether a counted member may be listed to this viewer: the viewer, or a member the one
    resolver shows online (invisible and hidden members resolve to offline)."""
    return relation.is_self or presence.is_online


class Candidate(NamedTuple):
    """A present member that may be listed: the member, when it joined, whether the viewer has
    it among their contacts. A tuple, as :class:`Member` (one per member read)."""

    user_id: UserId
    joined_at: float
    contact: bool = False
    is_self: bool = False


def order_listed(candidates: Iterable[Candidate], limit: int) -> list[UserId]:
    """Who is listed, in order: the viewer, then the viewer's contacts, then by join time
    (ties by id as text), at most ``limit``."""
    ranked = sorted(
        candidates,
        key=lambda c: (not c.is_self, not c.contact, c.joined_at, str(c.user_id)),
    )
    return [candidate.user_id for candidate in ranked[:limit]]


class Member(NamedTuple):
    """A listed member: its meta (compact JSON text or None) and presence as the viewer sees it.
    A tuple: a room's read makes one per member listed, and a frozen dataclass cost twice as
    much to build."""

    meta: str | None
    presence: Presence

    def as_dict(self) -> dict[str, Any]:
        return {
            "meta": None if self.meta is None else json.loads(self.meta),
            "presence": self.presence.as_dict(),
        }


@dataclass(frozen=True)
class RoomState:
    """A room as one viewer sees it."""

    room: Room
    members: Mapping[UserId, Member]
    others: int
    #: each listed member's place in the order of :func:`order_listed` (not a contact of the
    #: viewer, joined at, id as text): the live side keeps a full list in that order
    ranks: Mapping[UserId, tuple[bool, float, str]] = field(default_factory=dict)
    #: the cursor of the next page (opaque text, presence.rooms.cursors), None at the end
    next: str | None = None
    #: the join time its read by join time reached (infinite: the whole room; the members it
    #: lists from further down were looked up by a tie): a cursor made later from the same
    #: list starts no further (presence.rooms.cursors.after_listed)
    read_to: float = math.inf

    @property
    def count(self) -> int:
        return len(self.members) + self.others

    def as_dict(self, encode: Any = str) -> dict[str, Any]:
        """The JSON-ready state ``{"room", "members", "others", "count", "next"}``; ``encode``
        turns an id into the key clients see."""
        return {
            "room": self.room.name,
            "members": {encode(uid): member.as_dict() for uid, member in self.members.items()},
            "others": self.others,
            "count": self.count,
            "next": self.next,
        }


def shown_meta(connections: Sequence[tuple[float, str | None]]) -> str | None:
    """The meta shown with a member: that of its connection that joined last
    (``(joined_at, meta)`` per connection)."""
    if not connections:
        return None
    return max(connections, key=lambda entry: entry[0])[1]
