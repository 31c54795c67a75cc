"""Cursors of a room's pages (docs/rooms.md, "Paging"): where the next page of a room's members
starts, as the opaque ``next`` of every room answer.

A cursor names a place in the state's order (presence.domain.rooms.order_listed: the viewer,
then their contacts, then by join time, ties by id as text), never an offset: members joining
and leaving between two pages move no one across it, so no one is listed twice and no one who
stayed is skipped. The place may be that of a member the caller may not see (a page that read
far without finding one to list ends where it read), so a cursor is encrypted and
authenticated with the site's SECRET_KEY, bound to its room: a client can neither read it nor
make one, and a cursor that is not one of this room's is refused (InvalidInput, a 400).

A place is ``(phase, joined ms, id as text)``, phase 0 the viewer, 1 a contact, 2 the others.
A cursor is "after this place", except the ids it has seen: a room's first read may stop
inside a millisecond of joins (presence.rooms.reading reads by join time, not by id), so its
cursor starts at that millisecond and leaves out the members it listed there (by a short
digest of their ids). A first read also lists, wherever they joined, the members it looked up
by a tie (those who show the viewer their online status beyond "everyone"): its cursor starts
where its read by join time stopped, and leaves those out of every page after it (``ahead``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac
from django.utils.translation import gettext

from presence.conf import get_settings
from presence.domain import InvalidInput, UserId
from presence.domain.rooms import Room, RoomState
from presence.memo import bounded_memo

#: where a member sits in the state's order: the viewer, a contact, anyone else
PHASE_SELF, PHASE_CONTACT, PHASE_OTHER = 0, 1, 2

Place = tuple[int, float, str]
#: before every member: a cursor from a first read that listed no one
START: Place = (PHASE_SELF, -1.0, "")

#: a join time (ms) later than any: the place after every member of a phase
_AFTER_ANY_JOIN = float(2**62)

_SALT = "presence.rooms.cursors"
_NONCE = 12
_TAG = 16
_DIGEST = 6
#: phase, joined ms, the id's length in bytes
_HEAD = struct.Struct(">Bqh")
#: set in the phase's byte when the id is followed by the count of digests ahead (``>H``), the
#: digests ahead, then those seen (without it, as cursors were before: those seen only)
_AHEAD_FLAG = 0x80
_AHEAD_COUNT = struct.Struct(">H")
#: the longest id a place holds (domain.protocol.MAX_USER_ID_LENGTH characters of UTF-8)
_MAX_ID_BYTES = 4 * 255


@dataclass(frozen=True)
class Cursor:
    """After ``place``, but for the ids seen (digests) in its phase and millisecond, and for
    the ids listed ``ahead`` of it (wherever they are)."""

    place: Place
    seen: frozenset[bytes] = frozenset()
    ahead: frozenset[bytes] = frozenset()

    def passes(self, place: Place) -> bool:
        """Whether a member at ``place`` comes after the cursor."""
        if place <= self.place:
            return False
        if self.ahead and digest(place[2]) in self.ahead:
            return False
        return not (place[:2] == self.place[:2] and digest(place[2]) in self.seen)

    def following(self, place: Place) -> Cursor:
        """The cursor after ``place`` (a place past this one): the ids seen still count while
        it is in their millisecond, those listed ahead on every page."""
        seen = self.seen if place[:2] == self.place[:2] else frozenset()
        return Cursor(place, seen, self.ahead)


@bounded_memo(16384)
def digest(text: str) -> bytes:
    # Memoised: a room's first members are in most of its viewers' cursors (a burst of joins
    # made one per joiner, each of up to ROOM_LIST_LIMIT digests).
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_DIGEST).digest()


def place_of(user_id: UserId, rank: tuple[bool, float, str], viewer_id: UserId | None) -> Place:
    """A listed member's place, from its rank (presence.rooms.reading.rank)."""
    if user_id == viewer_id:
        return (PHASE_SELF, rank[1], rank[2])
    return (PHASE_OTHER if rank[0] else PHASE_CONTACT, rank[1], rank[2])


def after_listed(
    ranks: Mapping[UserId, tuple[bool, float, str]],
    viewer_id: UserId | None,
    read_to: float = math.inf,
) -> Cursor:
    """The cursor after a list read by join time (a room's state, first read or live) up to
    the join time ``read_to``: from the millisecond of its last member, without those it lists
    there; members it lists from further down (looked up by a tie) are left out of the pages
    after it wherever they come, and the cursor does not pass the members it did not read."""
    places = [place_of(uid, rank, viewer_id) for uid, rank in ranks.items()]
    within = [p for p in places if p[0] != PHASE_OTHER or p[1] <= read_to]
    ahead = frozenset(digest(p[2]) for p in places if p[0] == PHASE_OTHER and p[1] > read_to)
    if not within:
        return Cursor(START, frozenset(), ahead)
    last = max(within)
    seen = frozenset(digest(p[2]) for p in within if p[:2] == last[:2])
    return Cursor((last[0], last[1], ""), seen, ahead)


# --- the opaque text ---


#: (purpose, SECRET_KEY) -> salted_hmac's HMAC keyed for it, before any message
_keyed: dict[tuple[str, object], hmac.HMAC] = {}


def _mac(purpose: str, value: bytes) -> bytes:
    """``salted_hmac(purpose, value, algorithm="sha256").digest()``, the same bytes, its key
    derived once per SECRET_KEY: a cursor of a live view made 20 of them (a burst of 1,000
    joins spent 0.4 s of the event loop deriving keys)."""
    secret = settings.SECRET_KEY
    keyed = _keyed.get((purpose, secret))
    if keyed is None:
        if len(_keyed) >= 16:  # a test's changed SECRET_KEY: the old keys are no one's
            _keyed.clear()
        keyed = _keyed[(purpose, secret)] = salted_hmac(purpose, b"", algorithm="sha256")
    mac = keyed.copy()
    mac.update(value)
    return mac.digest()


def _stream(nonce: bytes, size: int) -> bytes:
    # HMAC-SHA256 as a pseudo-random function in counter mode: Django's own primitive, keyed
    # by SECRET_KEY (no dependency for a few dozen bytes).
    purpose = f"{_SALT}.stream"
    blocks = (_mac(purpose, nonce + struct.pack(">I", n)) for n in range(math.ceil(size / 32)))
    return b"".join(blocks)[:size]


def _xor(data: bytes, stream: bytes) -> bytes:
    """``data`` XOR ``stream`` (as long), as one integer operation, not a byte at a time."""
    size = len(data)
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(size, "big")


def _tag(room: Room, body: bytes) -> bytes:
    value = room.name.encode("utf-8", "surrogatepass") + b"\0" + body
    return _mac(f"{_SALT}.tag", value)[:_TAG]


def encode(room: Room, cursor: Cursor) -> str:
    """The cursor as the opaque text clients send back (URL-safe base64, no padding)."""
    phase, joined, ident = cursor.place
    raw = ident.encode("utf-8", "surrogatepass")
    seen = b"".join(sorted(cursor.seen))
    if cursor.ahead:
        head = _HEAD.pack(phase | _AHEAD_FLAG, int(joined), len(raw))
        ahead = _AHEAD_COUNT.pack(len(cursor.ahead)) + b"".join(sorted(cursor.ahead))
        plain = head + raw + ahead + seen
    else:
        plain = _HEAD.pack(phase, int(joined), len(raw)) + raw + seen
    nonce = secrets.token_bytes(_NONCE)
    secret = _xor(plain, _stream(nonce, len(plain)))
    body = nonce + secret
    return base64.urlsafe_b64encode(body + _tag(room, body)).rstrip(b"=").decode("ascii")


def max_length() -> int:
    """The longest cursor this server gives: the longest id, and a digest per member listed."""
    digests = _AHEAD_COUNT.size + _DIGEST * get_settings().ROOM_LIST_LIMIT
    size = _NONCE + _HEAD.size + _MAX_ID_BYTES + digests + _TAG
    return math.ceil(size * 4 / 3)


def decode(room: Room, text: object) -> Cursor:
    """The cursor ``text`` names, if this server gave it for ``room``; InvalidInput
    ``invalid_value`` otherwise (garbage, another room's, another server's, too long)."""
    limit = max_length()
    if not isinstance(text, str) or not 0 < len(text) <= limit:
        raise InvalidInput(
            "invalid_value",
            gettext(
                "'after' must be the 'next' of an answer about this room: a string of at most "
                "%(limit)d characters."
            )
            % {"limit": limit},
        )
    refused = InvalidInput(
        "invalid_value",
        gettext(
            "'after' is not a cursor this server gave for the room %(room)s; read the room "
            "again from its first page."
        )
        % {"room": room.name},
    )
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise refused from None
    body, tag = data[:-_TAG], data[-_TAG:]
    if len(body) < _NONCE + _HEAD.size or not constant_time_compare(tag, _tag(room, body)):
        raise refused
    nonce, secret = body[:_NONCE], body[_NONCE:]
    plain = _xor(secret, _stream(nonce, len(secret)))
    phase, joined, size = _HEAD.unpack_from(plain)
    rest = plain[_HEAD.size :]
    if not 0 <= size <= len(rest):
        raise refused  # pragma: no cover - authenticated: only this server's own text
    ident, rest = rest[:size].decode("utf-8", "surrogatepass"), rest[size:]
    ahead: frozenset[bytes] = frozenset()
    if phase & _AHEAD_FLAG:
        phase &= ~_AHEAD_FLAG
        if len(rest) < _AHEAD_COUNT.size:
            raise refused  # pragma: no cover - authenticated
        (count,) = _AHEAD_COUNT.unpack_from(rest)
        rest = rest[_AHEAD_COUNT.size :]
        ahead, rest = _digests(rest[: count * _DIGEST]), rest[count * _DIGEST :]
    if len(rest) % _DIGEST:
        raise refused  # pragma: no cover - authenticated
    return Cursor((phase, float(joined), ident), _digests(rest), ahead)


def _digests(data: bytes) -> frozenset[bytes]:
    return frozenset(data[n : n + _DIGEST] for n in range(0, len(data), _DIGEST))


def with_next(
    state: RoomState, viewer_id: UserId | None, complete: bool, read_to: float = math.inf
) -> RoomState:
    """``state`` (a room's first read or a live view) with the cursor of its next page; none
    where ``complete`` (it lists every member the viewer may see). ``read_to``: the join time
    its read by join time reached (:func:`after_listed`)."""
    if complete:
        return replace(state, read_to=read_to)
    ranks = state.ranks
    if viewer_id is not None and viewer_id in state.members and viewer_id not in ranks:
        # (a live view keeps no place for its viewer, always listed first: past it)
        ranks = {**ranks, viewer_id: (False, _AFTER_ANY_JOIN, "")}
    cursor = after_listed(ranks, viewer_id, read_to)
    return replace(state, next=encode(state.room, cursor), read_to=read_to)


def encoded(room: Room, cursor: Cursor | None) -> str | None:
    return None if cursor is None else encode(room, cursor)
