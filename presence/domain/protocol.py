"""The WebSocket frames a client sends, validated: the consumer's whole input surface, kept pure.
:func:`parse_frame` turns one text frame into a message or raises :class:`InvalidInput`;
:func:`parse_subscription_query` reads the subscribe an opening request's URL carries."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import unquote_to_bytes

from django.utils.translation import gettext

from presence.domain.nesting import nests_too_deeply
from presence.domain.rooms import Room, parse_meta, parse_room
from presence.domain.validation import InvalidInput, Limits, StatusChange, parse_status_change


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
    #: ``"since"`` was sent: the answer carries a stamp (docs/websocket.md, "Stamps")
    stamped: bool = False
    #: the stamp sent (None: none, a full snapshot): only what changed since it is sent
    since: str | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    users: tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class SetStatus:
    change: StatusChange


@dataclass(frozen=True, slots=True)
class Join:
    room: Room
    #: the connection's meta in the room, compact JSON text (None: null)
    meta: str | None = None


@dataclass(frozen=True, slots=True)
class Leave:
    room: Room


@dataclass(frozen=True, slots=True)
class RoomMore:
    """Send me the next page of a room's members after ``after`` (the ``next`` of the room's
    last answer): answered ``room_page`` (docs/rooms.md, "Paging")."""

    room: Room
    #: the cursor as the client sent it (checked by presence.rooms.cursors: it is opaque)
    after: str


@dataclass(frozen=True, slots=True)
class WatchCount:
    """Send me the site's online count now, and its changes (``online_count`` frames)."""


@dataclass(frozen=True, slots=True)
class UnwatchCount:
    """Stop sending me the online count."""


@dataclass(frozen=True, slots=True)
class WatchRoomCount:
    """Send me ``room``'s count as I may see it now, and its changes (``room_count`` frames),
    without joining it: an index page's live "3 here" (docs/rooms.md)."""

    room: Room


@dataclass(frozen=True, slots=True)
class UnwatchRoomCount:
    """Stop sending me ``room``'s count."""

    room: Room


@dataclass(frozen=True, slots=True)
class Extension:
    """A frame of a type an installed app added (presence.extensions): its type, and what the
    app's parser made of it."""

    type: str
    message: Any


ClientMessage = (
    Heartbeat
    | Subscribe
    | Unsubscribe
    | SetStatus
    | Join
    | Leave
    | RoomMore
    | WatchCount
    | UnwatchCount
    | WatchRoomCount
    | UnwatchRoomCount
    | Extension
)

CLIENT_TYPES = (
    "heartbeat",
    "subscribe",
    "unsubscribe",
    "set_status",
    "join",
    "leave",
    "room_more",
    "watch_count",
    "unwatch_count",
    "watch_room_count",
    "unwatch_room_count",
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


#: the longest stamp a client may send (the server's are about 34 characters)
MAX_STAMP_LENGTH = 64


def _since(since: Any) -> str | None:
    """A subscribe's ``since``: a stamp the server gave (checked by the consumer: one that
    proves nothing gets the full snapshot), or null for none."""
    if since is None:
        return None
    if not isinstance(since, str) or not 0 < len(since) <= MAX_STAMP_LENGTH:
        raise InvalidInput(
            "invalid_value",
            gettext("'since' must be a stamp the server gave (a string), or null."),
        )
    return since


def parse_subscription_query(query_string: bytes, limits: Limits) -> Subscribe | None:
    """The subscription a socket's opening request carries in its query string,
    ``users=ID,ID,...`` and optionally ``since=STAMP`` (``since=`` alone: null), checked as a
    subscribe frame's (the same errors); None when it names no ``users`` (or none in it). Each id is
    percent-encoded on its own (a comma inside one is ``%2C``), UTF-8."""
    if len(query_string) > limits.max_frame_bytes:
        raise InvalidInput(
            "invalid_value",
            gettext("The query string is %(size)d bytes long; at most %(limit)d.")
            % {"size": len(query_string), "limit": limits.max_frame_bytes},
        )
    fields: dict[str, list[bytes]] = {}
    for part in query_string.split(b"&"):
        name, _, value = part.partition(b"=")
        if name in (b"users", b"since"):
            fields.setdefault(name.decode(), []).append(value)
    if "users" not in fields:
        if "since" in fields:
            raise InvalidInput("invalid_message", gettext("'since' goes with 'users'."))
        return None
    if any(len(values) > 1 for values in fields.values()):
        raise InvalidInput(
            "invalid_message", gettext("Name 'users' and 'since' at most once each.")
        )
    raw = fields["users"][0]
    if not raw:
        return None  # no ids: nothing to subscribe, nothing to answer
    try:
        if raw.isascii() and b"%" not in raw:
            users = raw.decode().split(",")  # the usual ids: nothing to unquote
        else:
            users = [unquote_to_bytes(piece).decode() for piece in raw.split(b",")]
        since = [unquote_to_bytes(value).decode() for value in fields.get("since", [])]
    except UnicodeDecodeError:
        raise InvalidInput(
            "invalid_value", gettext("The query string is not percent-encoded UTF-8.")
        ) from None
    ids = _user_ids({"users": users}, limits)
    if not since:
        return Subscribe(ids)
    return Subscribe(ids, stamped=True, since=_since(since[0] or None))


def _nests_too_deeply() -> InvalidInput:
    # No frame of the protocol nests more than two levels (domain.nesting.MAX_JSON_DEPTH).
    return InvalidInput("invalid_message", gettext("The frame nests arrays or objects too deeply."))


#: the frames that name one room (their errors name it too)
RoomFrame = Join | Leave | RoomMore | WatchRoomCount | UnwatchRoomCount
ROOM_FRAME_TYPES = ("join", "leave", "room_more", "watch_room_count", "unwatch_room_count")


def _room_frame(kind: str, data: Mapping[str, Any]) -> RoomFrame:
    room = data.get("room")
    if not isinstance(room, str):
        raise InvalidInput(
            "invalid_message", gettext("'room' is required and must be a string (kind:id).")
        )
    try:
        return _parse_room_frame(kind, room, data)
    except InvalidInput as error:
        # Named: a client tells the refusal of its join from the answer of a set_status.
        raise InvalidInput(error.code, error.message, room=room) from None


def _parse_room_frame(kind: str, room: str, data: Mapping[str, Any]) -> RoomFrame:
    if kind == "leave":
        return Leave(parse_room(room))
    if kind == "watch_room_count":
        return WatchRoomCount(parse_room(room))
    if kind == "unwatch_room_count":
        return UnwatchRoomCount(parse_room(room))
    if kind == "room_more":
        after = data.get("after")
        if not isinstance(after, str):
            raise InvalidInput(
                "invalid_message",
                gettext(
                    "'after' is required and must be a string: the 'next' of the room's answer."
                ),
            )
        return RoomMore(parse_room(room), after)
    return Join(parse_room(room), parse_meta(data.get("meta")))


def parse_frame(
    text: str | None,
    limits: Limits,
    extra: Mapping[str, Callable[[Mapping[str, Any]], Any]] | None = None,
    typed: Callable[[str], None] | None = None,
) -> ClientMessage:
    """One client frame as a message, or InvalidInput naming the problem (contract codes, plus
    ``frame_too_large``). ``extra`` parses the types installed apps added (type -> parser,
    see presence.extensions); presence's own types come first. ``typed`` is told the frame's
    type once it is one this site accepts, before the rest is read: an error of the rest then
    names the frame it answers."""
    if text is None:
        raise InvalidInput("invalid_message", gettext("Send JSON text frames, not binary ones."))
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_frame_bytes:
        raise InvalidInput(
            "frame_too_large",
            gettext("The frame is %(size)d bytes long; at most %(limit)d.")
            % {"size": size, "limit": limits.max_frame_bytes},
        )
    # Measured before parsing: json's own limit (a RecursionError) differs between Pythons.
    if nests_too_deeply(text):
        raise _nests_too_deeply()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise InvalidInput("invalid_json", gettext("The frame is not valid JSON.")) from None
    except ValueError:  # a number longer than Python converts (4,300 digits): valid JSON?
        try:
            json.loads(text, parse_int=len)  # (its syntax alone, each integer left unconverted)
        except json.JSONDecodeError:
            raise InvalidInput("invalid_json", gettext("The frame is not valid JSON.")) from None
        raise InvalidInput(
            "invalid_value", gettext("A number in the frame has too many digits.")
        ) from None
    except RecursionError:  # pragma: no cover - nests_too_deeply refuses far shallower
        raise _nests_too_deeply() from None
    if not isinstance(data, dict):
        raise InvalidInput("invalid_message", gettext("Expected a JSON object."))
    kind = data.get("type")
    if not isinstance(kind, str):
        raise InvalidInput("invalid_message", gettext("'type' is required and must be a string."))
    if typed is not None and (kind in CLIENT_TYPES or (extra and kind in extra)):
        typed(kind)
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
        if "since" not in data:
            return Subscribe(_user_ids(data, limits))
        return Subscribe(_user_ids(data, limits), stamped=True, since=_since(data["since"]))
    if kind == "unsubscribe":
        return Unsubscribe(_user_ids(data, limits))
    if kind == "set_status":
        return SetStatus(parse_status_change(data, limits))
    if kind in ROOM_FRAME_TYPES:
        return _room_frame(kind, data)
    if kind == "watch_count":
        return WatchCount()
    if kind == "unwatch_count":
        return UnwatchCount()
    if extra and kind in extra:
        return Extension(kind, extra[kind](data))
    raise InvalidInput(
        "unknown_type",
        gettext("Unknown message type %(type)s: use one of %(types)s.")
        % {"type": repr(kind)[:60], "types": ", ".join([*CLIENT_TYPES, *(extra or ())])},
    )
