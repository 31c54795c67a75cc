"""What tests/live/test_fuzz_consumer.py checks the consumer's answers against: what the protocol
says each frame gets, the frames (Hypothesis strategies), checking what comes back, and other
users' state.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.contrib.auth import get_user_model
from hypothesis import strategies as st

from presence.domain import CLIENT_TYPES
from presence.hub import Hub
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus
from tests.fuzz_cases import (
    MAX_INT_ID,
    dumps,
    edge_ints,
    int_pk,
    junk_json,
    odd_text,
    refused_text,
    uuid_pk,
)
from tests.live.sockets import TIMEOUT

#: the documented limits the oracle works with (presence's defaults)
MAX_FRAME_BYTES = 65536
MAX_SUBSCRIPTIONS = 1000
TEXT_MAX_LENGTH = 140
EMOJI_MAX_LENGTH = 16
MAX_STATUS_EXPIRY = 30 * 24 * 3600
MAX_FEEDS = 10
ERROR_CODES = frozenset(
    {
        "invalid_json",
        "invalid_message",
        "unknown_type",
        "invalid_value",
        "unknown_users",
        "too_many_subscriptions",
        "frame_too_large",
        "unknown_feed",
        "too_many_feeds",
        "internal_error",
    }
)
STATUSES = frozenset({"online", "idle", "dnd", "offline"})
DEVICES = frozenset({"web", "mobile", "desktop"})
PRESENCE_KEYS = frozenset(
    {"status", "last_seen", "last_seen_approx", "devices", "text", "emoji", "activity"}
)
APPROXIMATIONS = frozenset({None, "recently", "within_week", "within_month", "long_ago"})
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$")
MISSING = object()
#: characters of well-formed status text: letters of several scripts, emoji with joiners and
#: tags, spaces (stripped at the ends)
GOOD_CHARACTERS = "ab Z9\u0645\u05d0\u00e9\u4e2d\U0001f600\u200d\u200c\U0001f3f4\U000e0067"


def feed_installed() -> bool:
    return apps.is_installed("presence.feed")


# --- what the protocol says each frame gets ----------------------------------------------------


@dataclass(frozen=True)
class Error:
    """One error frame, of one of these codes (a frame with several faults may name any),
    naming what it answers (``named``: the ``feed`` of a watch_feed, as sent)."""

    codes: frozenset[str]
    named: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Silent:
    """No answer at all."""


@dataclass(frozen=True)
class Unmodelled:
    """One of presence's own frame types this oracle leaves to its own tests (rooms' join and
    leave, the online count's watch frames, on a site without rooms): any answer, well-formed."""


@dataclass(frozen=True)
class Snapshot:
    """A presence_state of exactly these keys; then an unknown_users error naming ``unknown``
    (as sent), if any."""

    keys: frozenset[str]
    unknown: tuple[Any, ...]


@dataclass(frozen=True)
class StatusReply:
    statuses: frozenset[str]
    invisible: bool
    text: str | None
    emoji: str | None
    activity: str | None
    #: the own presence says when the custom status clears (expires_at)
    clears: bool = False


Expectation = Error | Silent | Unmodelled | Snapshot | StatusReply


#: what an error answering a subscribe (or the opening request's subscription) names
ANSWERS_SUBSCRIBE = (("answers", "subscribe"),)


def error(*codes: str, **named: str) -> Error:
    return Error(frozenset(codes), tuple(sorted(named.items())))


@dataclass
class ConnectionModel:
    """What the oracle knows of one open connection: what it subscribes and watches."""

    subscribed: set[Any] = field(default_factory=set)
    watched: set[str] = field(default_factory=set)


@dataclass
class Site:
    """The users, groups and pk kind of the fuzzed site."""

    pk_kind: str
    existing: frozenset[Any]
    groups: frozenset[str]
    frame_types: frozenset[str]

    def pk(self, value: Any) -> Any:
        """The pk a client's id names, or None where the site's key cannot be it."""
        return int_pk(value) if self.pk_kind == "int" else uuid_pk(value)

    def user_feed(self, key: str) -> str | None:
        """``user:<key>``'s canonical name, or None when ``key`` cannot name a user."""
        if not key or len(key) > 255 or any(ch.isspace() for ch in key):
            return None
        if self.pk_kind == "int":
            if not re.fullmatch(r"[1-9][0-9]{0,18}", key) or int(key) > MAX_INT_ID:
                return None
            return f"user:{int(key)}"
        pk = uuid_pk(key)
        return None if pk is None else f"user:{pk}"


def expected(payload: str | bytes, connection: ConnectionModel, site: Site) -> Expectation:
    """What the protocol (docs/websocket.md) answers ``payload``; a frame that is obeyed
    updates ``connection`` as the consumer's own state should change."""
    if isinstance(payload, bytes):
        return error("invalid_message")
    if len(payload.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        return error("frame_too_large")
    try:
        json.loads(payload, parse_int=str)  # its syntax: JSON's own rules
    except ValueError:
        return error("invalid_json")
    except RecursionError:
        return error("invalid_message")
    try:
        data = json.loads(payload)
    except ValueError:  # valid JSON, a number of more digits than Python converts
        return error("invalid_value")
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        return error("invalid_message")
    kind = data["type"]
    if kind not in site.frame_types:
        if kind in CLIENT_TYPES:
            return Unmodelled()
        return error("unknown_type")
    answer = _expected_of_type(data, kind, connection, site)
    if isinstance(answer, Error):
        # Every error answering a frame of a type the site accepts names it (websocket.md).
        return Error(answer.codes, tuple(sorted({**dict(answer.named), "answers": kind}.items())))
    return answer


def _expected_of_type(
    data: dict[str, Any], kind: str, connection: ConnectionModel, site: Site
) -> Expectation:
    if kind == "heartbeat":
        state = data.get("state", "active")
        if not isinstance(state, str):
            return error("invalid_message")
        return Silent() if state in ("active", "idle") else error("invalid_value")
    if kind in ("subscribe", "unsubscribe"):
        return _expected_ids(data, kind, connection, site)
    if kind == "set_status":
        return _expected_status(data)
    return _expected_feed(data, kind, connection, site)


def listed_ids(data: dict[str, Any]) -> list[Any] | Error:
    """The ids of a subscribe or unsubscribe as sent, each once, if their form is right
    whatever the site's pk (numbers in range, strings not empty nor too long, not too many);
    else the error answering them."""
    sent = data.get("users")
    if not isinstance(sent, list) or not all(
        isinstance(value, int | str) and not isinstance(value, bool) for value in sent
    ):
        return error("invalid_message")
    if any(isinstance(value, int) and not 1 <= value <= MAX_INT_ID for value in sent):
        return error("invalid_value")
    if any(isinstance(value, str) and not 0 < len(value) <= 255 for value in sent):
        return error("invalid_value")
    unique = list(dict.fromkeys(sent))
    if len(unique) > MAX_SUBSCRIPTIONS:
        return error("too_many_subscriptions")
    return unique


def weight(payload: str | bytes) -> int:
    """How many frames of RATE_LIMIT a frame counts as: a subscribe or unsubscribe of n ids
    (of the right form) max(1, ceil(n / 100)), any other frame one (docs/websocket.md)."""
    if isinstance(payload, bytes):
        return 1
    if len(payload.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        return 1
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return 1
    if not isinstance(data, dict) or data.get("type") not in ("subscribe", "unsubscribe"):
        return 1
    unique = listed_ids(data)
    return 1 if isinstance(unique, Error) else max(1, math.ceil(len(unique) / 100))


def _expected_ids(
    data: dict[str, Any], kind: str, connection: ConnectionModel, site: Site
) -> Expectation:
    unique = listed_ids(data)
    if isinstance(unique, Error):
        return unique
    spelling: dict[Any, Any] = {}
    for value in unique:
        pk = site.pk(value)
        if pk is None:
            return error("invalid_value")
        spelling.setdefault(pk, value)
    if kind == "unsubscribe":
        connection.subscribed.difference_update(spelling)
        return Silent()
    new = [pk for pk in spelling if pk not in connection.subscribed]
    if len(connection.subscribed) + len(new) > MAX_SUBSCRIPTIONS:
        return error("too_many_subscriptions")
    known = [pk for pk in new if pk in site.existing]
    connection.subscribed.update(known)
    return Snapshot(
        keys=frozenset(str(spelling[pk]) for pk in known),
        unknown=tuple(spelling[pk] for pk in new if pk not in site.existing),
    )


def _text_faults(data: dict[str, Any], name: str, limit: int) -> set[str]:
    value = data.get(name)
    if value is None:
        return set()
    if not isinstance(value, str):
        return {"invalid_message"}
    value = value.strip()
    return {"invalid_value"} if refused_text(value) or len(value) > limit else set()


def _expected_status(data: dict[str, Any]) -> Expectation:
    faults: set[str] = set()
    status = data.get("status")
    if not isinstance(status, str):
        faults.add("invalid_message")
    elif status not in ("auto", "dnd", "invisible"):
        faults.add("invalid_value")
    expires_in = data.get("expires_in")
    if expires_in is not None:
        if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
            faults.add("invalid_message")
        elif not 1 <= expires_in <= MAX_STATUS_EXPIRY:  # NaN is in no range
            faults.add("invalid_value")
    faults |= _text_faults(data, "text", TEXT_MAX_LENGTH)
    faults |= _text_faults(data, "emoji", EMOJI_MAX_LENGTH)
    faults |= _text_faults(data, "activity", TEXT_MAX_LENGTH)
    if faults:
        return Error(frozenset(faults))

    def shown(name: str) -> str | None:
        return (data.get(name) or "").strip() or None

    custom = (shown("text"), shown("emoji"), shown("activity"))
    return StatusReply(
        statuses=frozenset({"dnd"} if status == "dnd" else {"online", "idle"}),
        invisible=status == "invisible",
        text=custom[0],
        emoji=custom[1],
        activity=custom[2],
        clears=expires_in is not None and any(custom),
    )


def _expected_feed(
    data: dict[str, Any], kind: str, connection: ConnectionModel, site: Site
) -> Expectation:
    name = data.get("feed")
    if not isinstance(name, str):
        return error("invalid_message")
    # Every error answering it names the feed as sent (websocket.md, "Errors").
    named = {"feed": name}
    if name in ("following", "mentions") or re.fullmatch(r"group:[-a-zA-Z0-9_]{1,100}", name):
        canonical: str | None = name
    elif name.startswith("user:"):
        canonical = site.user_feed(name[5:])
    else:
        canonical = None
    if canonical is None:
        return error("invalid_value", **named)
    if kind == "unwatch_feed":
        connection.watched.discard(canonical)
        return Silent()
    if canonical in connection.watched:
        return Silent()
    if len(connection.watched) >= MAX_FEEDS:
        return error("too_many_feeds", **named)
    feed_kind, _, key = canonical.partition(":")
    exists = (
        (feed_kind == "user" and site.pk(key) in site.existing)
        or (feed_kind == "group" and key in site.groups)
        or feed_kind in ("following", "mentions")
    )
    if not exists:
        return error("unknown_feed", **named)
    connection.watched.add(canonical)
    return Silent()


# --- the frames ---------------------------------------------------------------------------------


def _frame(fields: dict[str, Any], extra: dict[str, Any], ascii_only: bool) -> str:
    """A JSON object frame of ``fields`` (MISSING ones left out) and ``extra`` fields."""
    content = {**extra, **{k: v for k, v in fields.items() if v is not MISSING}}
    return dumps(content, ascii_only)


def optional(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(MISSING), values)


#: fields no frame type reads (ignored, as the protocol allows)
extra_fields = st.dictionaries(
    st.sampled_from(["extra", "id", "ref", "", "\u202e", "__proto__"]), junk_json, max_size=2
)


def frames(site: Site, spellings: list[Any], unknown_ids: st.SearchStrategy[Any]) -> Any:
    """Every kind of frame: each frame type well-formed and with each field wrong, and frames
    that are no frame at all (junk JSON, non-JSON text, binary, oversize, deeply nested)."""
    user_id = st.one_of(
        st.sampled_from(spellings),  # the site's users, in every spelling
        unknown_ids,  # ids of the site's pk kind that name no user
        edge_ints,  # zero, negative, past 2**63, huge
        odd_text,  # not an id
        st.uuids().map(str),  # a UUID (names no user of an integer-keyed site)
        st.integers(min_value=1, max_value=10**6).map(str),
        st.text(alphabet="0123456789", min_size=18, max_size=21),
        st.just("x" * 256),
        junk_json,  # floats, NaN, bools, null, lists, objects
    )
    ids = st.one_of(
        st.lists(user_id, max_size=6),
        junk_json,
        # more than MAX_SUBSCRIPTIONS ids at once (or just at it)
        st.integers(min_value=999, max_value=1001).map(
            lambda n: list(range(1_000_000, 1_000_000 + n))
        ),
    )
    ascii_only = st.booleans()
    heartbeat = st.builds(
        lambda state, extra, a: _frame({"type": "heartbeat", "state": state}, extra, a),
        optional(st.one_of(st.sampled_from(["active", "idle", "Active", "idle "]), junk_json)),
        extra_fields,
        ascii_only,
    )
    subscriptions = st.builds(
        lambda kind, users_, extra, a: _frame({"type": kind, "users": users_}, extra, a),
        st.sampled_from(["subscribe", "unsubscribe"]),
        optional(ids),
        extra_fields,
        ascii_only,
    )
    near_limit = st.integers(min_value=0, max_value=200).map(lambda n: "x" * n)
    text_value = optional(st.one_of(st.none(), odd_text, near_limit, junk_json))
    set_status = st.builds(
        lambda status, text, emoji, activity, expires_in, extra, a: _frame(
            {
                "type": "set_status",
                "status": status,
                "text": text,
                "emoji": emoji,
                "activity": activity,
                "expires_in": expires_in,
            },
            extra,
            a,
        ),
        optional(st.one_of(st.sampled_from(["auto", "dnd", "invisible", "DND", ""]), junk_json)),
        text_value,
        optional(st.one_of(st.none(), odd_text, st.sampled_from(["\U0001f3a7", "\u2764\ufe0f"]))),
        text_value,
        optional(
            st.one_of(
                st.none(),
                st.sampled_from([0, 1, 0.5, 1.5, MAX_STATUS_EXPIRY, MAX_STATUS_EXPIRY + 1]),
                edge_ints,
                st.floats(allow_nan=True, allow_infinity=True),
                junk_json,
            )
        ),
        extra_fields,
        ascii_only,
    )
    feed_name = st.one_of(
        st.sampled_from(["following", "mentions", "following\n", "mentions\n", "Following"]),
        st.sampled_from(sorted(site.groups)).map(lambda slug: f"group:{slug}"),
        st.sampled_from(["group:nope", "group:", "group:a b", "group:" + "a" * 101]),
        st.one_of(st.sampled_from(spellings), unknown_ids, user_id).map(lambda v: f"user:{v}"),
        st.sampled_from(spellings).map(lambda v: f"user:{v}\n"),
        odd_text,
        junk_json,
    )
    feeds = st.builds(
        lambda kind, feed, extra, a: _frame({"type": kind, "feed": feed}, extra, a),
        st.sampled_from(["watch_feed", "unwatch_feed"]),
        optional(feed_name),
        extra_fields,
        ascii_only,
    )
    # (Hypothesis may draw a string constant of the code under test: never a known type here.)
    unknown_type = st.builds(
        lambda kind, extra, a: _frame({"type": kind}, extra, a),
        optional(
            st.one_of(odd_text, junk_json, st.sampled_from(["HEARTBEAT", "subscribe "])).filter(
                lambda kind: (
                    not isinstance(kind, str)
                    or (kind not in CLIENT_TYPES and kind not in site.frame_types)
                )
            )
        ),
        extra_fields,
        ascii_only,
    )
    any_json = st.builds(dumps, junk_json, ascii_only)
    raw_text = st.one_of(
        odd_text,
        st.sampled_from(["", " ", "{", '{"type": "heartbeat"', "[]", "null", "NaN", "\ufeff{}"]),
    )
    binary = st.binary(max_size=24)
    # Past MAX_FRAME_BYTES by a little, at it, or just under it; in characters of 1 to 4 bytes.
    sized = st.builds(
        _sized_frame,
        st.integers(min_value=-3, max_value=3) | st.integers(min_value=4, max_value=4000),
        st.sampled_from(["x", "\xe9", "\u20ac", "\U0001f600", "\ud800"]),
    )
    deep = st.builds(
        _deep_frame,
        st.integers(min_value=1, max_value=40) | st.integers(min_value=3000, max_value=30000),
        st.sampled_from(["list", "object", "users", "state"]),
    )
    # Keys named twice (JSON says nothing; Python's reader keeps the last) and number literals
    # too long to read.
    literal = st.builds(
        lambda parts: "{" + ",".join(parts) + "}",
        st.lists(
            st.sampled_from(
                [
                    '"type":"heartbeat"',
                    '"type":"subscribe"',
                    '"type":"set_status"',
                    '"users":[]',
                    '"users":[1e400]',
                    '"users":[' + "9" * 5000 + "]",
                    '"status":"dnd"',
                    '"expires_in":1e999',
                    '"expires_in":-0.0',
                    '"state":"idle"',
                    '"feed":"following"',
                    '"type":"watch_feed"',
                ]
            ),
            max_size=5,
        ),
    )
    # The same frame types well-formed (else few frames would get past the first bad field).
    good_text = st.one_of(
        st.none(),
        st.text(alphabet=st.sampled_from(GOOD_CHARACTERS), max_size=TEXT_MAX_LENGTH + 2),
    )
    good_status = st.builds(
        lambda status, text, emoji, activity, expires_in, a: _frame(
            {
                "type": "set_status",
                "status": status,
                "text": text,
                "emoji": emoji,
                "activity": activity,
                "expires_in": expires_in,
            },
            {},
            a,
        ),
        st.sampled_from(["auto", "dnd", "invisible"]),
        optional(good_text),
        optional(st.sampled_from([None, "", "🎧", "👩‍💻", " x "])),
        optional(good_text),
        optional(
            st.one_of(
                st.none(),
                st.integers(min_value=1, max_value=MAX_STATUS_EXPIRY),
                st.floats(min_value=1, max_value=MAX_STATUS_EXPIRY),
            )
        ),
        ascii_only,
    )
    good_ids = st.builds(
        lambda kind, users_, a: _frame({"type": kind, "users": users_}, {}, a),
        st.sampled_from(["subscribe", "subscribe", "unsubscribe"]),
        st.lists(st.one_of(st.sampled_from(spellings), unknown_ids), max_size=5),
        ascii_only,
    )
    good_feed = st.builds(
        lambda kind, feed, a: _frame({"type": kind, "feed": feed}, {}, a),
        st.sampled_from(["watch_feed"] * 4 + ["unwatch_feed"]),
        st.one_of(
            st.sampled_from(["following", "mentions"]),
            st.sampled_from(sorted(site.groups)).map(lambda slug: f"group:{slug}"),
            st.sampled_from(spellings).map(lambda v: f"user:{v}"),
        ),
        ascii_only,
    )
    good = [heartbeat, good_status, good_ids]
    if "watch_feed" in site.frame_types:
        good.append(good_feed)
    return st.one_of(
        *good,
        heartbeat,
        subscriptions,
        set_status,
        feeds,
        unknown_type,
        any_json,
        raw_text,
        binary,
        sized,
        deep,
        literal,
    )


def _sized_frame(offset: int, pad: str) -> str:
    """A heartbeat padded to MAX_FRAME_BYTES + ``offset`` bytes (at most: a wide character may
    fall short of it)."""
    start, end = '{"type": "heartbeat", "pad": "', '"}'
    room = MAX_FRAME_BYTES + offset - len(start) - len(end)
    width = len(pad.encode("utf-8", "surrogatepass"))
    return start + pad * (room // width) + "x" * (room % width) + end


def _deep_frame(depth: int, shape: str) -> str:
    if shape == "list":
        return "[" * depth + "]" * depth
    if shape == "object":
        return '{"a":' * depth + "1" + "}" * depth
    nested = "[" * depth + "]" * depth
    if shape == "users":
        return '{"type":"subscribe","users":' + nested + "}"
    return '{"type":"heartbeat","state":' + nested + "}"


# --- checking what comes back -----------------------------------------------------------------


def outcome(expectation: Expectation) -> str:
    if isinstance(expectation, Error):
        return "/".join(sorted(expectation.codes))
    if isinstance(expectation, Snapshot) and expectation.unknown:
        return "snapshot+unknown_users"
    return type(expectation).__name__


def check_presence(value: Any, own: bool = False) -> None:
    assert isinstance(value, dict), value
    keys = set(value)
    own_keys = (PRESENCE_KEYS | {"invisible"}, PRESENCE_KEYS | {"invisible", "expires_at"})
    assert keys == PRESENCE_KEYS or keys in own_keys, value
    assert "expires_at" not in value or ISO_UTC.match(value["expires_at"]), value
    assert value["status"] in STATUSES, value
    assert value["last_seen"] is None or ISO_UTC.match(value["last_seen"]), value
    assert value["last_seen_approx"] in APPROXIMATIONS, value
    assert value["last_seen"] is None or value["last_seen_approx"] is None, value
    assert isinstance(value["devices"], list) and set(value["devices"]) <= DEVICES, value
    for name in ("text", "emoji", "activity"):
        assert value[name] is None or (isinstance(value[name], str) and value[name]), value
    if own:
        assert isinstance(value.get("invisible"), bool), value


def check_unprompted(frame: dict[str, Any]) -> None:
    """A frame the server may send at any time: a diff, or an activity of a watched feed."""
    if frame["type"] == "presence_diff":
        assert isinstance(frame["presences"], dict) and frame["presences"], frame
        for presence in frame["presences"].values():
            check_presence(presence)
    else:
        assert frame["type"] == "activity", frame


def check_error(
    frame: dict[str, Any], codes: frozenset[str], named: tuple[tuple[str, str], ...] = ()
) -> None:
    assert frame["type"] == "error", frame
    assert frame["code"] in codes, frame
    assert isinstance(frame["message"], str) and frame["message"], frame
    assert set(frame) == {"type", "code", "message", *dict(named)}, frame
    assert all(frame[field] == value for field, value in named), (frame, named)


def check_replies(replies: list[dict[str, Any]], expectation: Expectation) -> None:
    if isinstance(expectation, Silent):
        assert replies == []
    elif isinstance(expectation, Unmodelled):
        for reply in replies:
            if reply["type"] == "error":
                named = {k: v for k, v in reply.items() if k not in ("room", "answers")}
                check_error(named, ERROR_CODES)
    elif isinstance(expectation, Error):
        assert len(replies) == 1, replies
        check_error(replies[0], expectation.codes, expectation.named)
    elif isinstance(expectation, Snapshot):
        assert replies and replies[0]["type"] == "presence_state", replies
        assert set(replies[0]) == {"type", "presences"}, replies
        assert set(replies[0]["presences"]) == expectation.keys, replies
        for presence in replies[0]["presences"].values():
            check_presence(presence)
        if expectation.unknown:
            assert len(replies) == 2, replies
            unknown = replies[1]
            assert unknown["users"] == list(expectation.unknown), unknown
            told = {k: v for k, v in unknown.items() if k != "users"}
            check_error(told, ERROR_CODES, ANSWERS_SUBSCRIBE)
            assert unknown["code"] == "unknown_users", unknown
        else:
            assert len(replies) == 1, replies
    else:
        assert len(replies) == 1 and replies[0]["type"] == "status", replies
        assert set(replies[0]) == {"type", "presence"}, replies
        own = replies[0]["presence"]
        check_presence(own, own=True)
        assert own["status"] in expectation.statuses, (own, expectation)
        assert own["invisible"] is expectation.invisible, own
        assert ("expires_at" in own) is expectation.clears, (own, expectation)
        assert (own["text"], own["emoji"], own["activity"]) == (
            expectation.text,
            expectation.emoji,
            expectation.activity,
        ), own


#: a frame answered by an error naming its number: the end of the previous frame's answers
SENTINEL = '{"type":"heartbeat","state":"fuzz-sentinel-%d"}'


async def replies_until(
    socket: WebsocketCommunicator, mark: int
) -> tuple[list[Any], dict[str, Any] | None]:
    """The answers before sentinel ``mark``'s (diffs and activities checked and left out), and
    the close event if the socket closed instead."""
    replies = []
    while True:
        output = await socket.receive_output(timeout=TIMEOUT)
        if output["type"] == "websocket.close":
            return replies, output
        assert output["type"] == "websocket.send", output
        frame = json.loads(output["text"])
        assert isinstance(frame, dict) and isinstance(frame.get("type"), str), frame
        if frame["type"] == "error" and f"'fuzz-sentinel-{mark}'" in frame["message"]:
            check_error(frame, frozenset({"invalid_value"}), (("answers", "heartbeat"),))
            return replies, None
        if frame["type"] in ("presence_diff", "activity"):
            check_unprompted(frame)
        else:
            replies.append(frame)


class Fuzzer:
    """Sends batches of frames over the fuzzing user's connections and checks every answer."""

    def __init__(self, sockets: list[WebsocketCommunicator], site: Site) -> None:
        self.sockets = sockets
        self.models = [ConnectionModel() for _ in sockets]
        self.site = site
        self.answered = 0
        self.marks = 0
        #: how many frames got each kind of answer (an error by its code)
        self.outcomes: Counter[str] = Counter()

    async def send(self, batch: list[tuple[int, str | bytes]]) -> None:
        """Send the whole batch at once (each frame followed by a sentinel), then read."""
        plan: list[tuple[int, str | bytes, Expectation, int]] = []
        for index, payload in batch:
            socket = self.sockets[index % len(self.sockets)]
            # The oracle runs in frame order, as the consumer handles them.
            expectation = expected(payload, self.models[index % len(self.sockets)], self.site)
            if isinstance(payload, bytes):
                await socket.send_input({"type": "websocket.receive", "bytes": payload})
            else:
                await socket.send_input({"type": "websocket.receive", "text": payload})
            self.marks += 1
            await socket.send_input({"type": "websocket.receive", "text": SENTINEL % self.marks})
            plan.append((index % len(self.sockets), payload, expectation, self.marks))
        for index, payload, expectation, mark in plan:
            replies, closed = await replies_until(self.sockets[index], mark)
            assert closed is None, f"frame {payload[:300]!r} closed the socket: {closed}"
            try:
                check_replies(replies, expectation)
            except AssertionError as failure:
                raise AssertionError(
                    f"frame {payload[:300]!r} got {replies!r}, expected {expectation}"
                ) from failure
            self.answered += 1
            self.outcomes[outcome(expectation)] += 1


# --- other users' state -------------------------------------------------------------------------


def _rows(queryset: Any, *fields: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(row.items())) for row in queryset.values(*fields))


@sync_to_async
def database_of_others(fuzzer: Any) -> dict[str, Any]:
    """Every presence and feed row but what the fuzzing user may change about itself (its
    status and its invisibility)."""
    rows = {
        "UserStatus": _rows(UserStatus.objects.exclude(user=fuzzer)),
        "PrivacySettings": _rows(PrivacySettings.objects.exclude(user=fuzzer)),
        "own privacy": _rows(
            PrivacySettings.objects.filter(user=fuzzer),
            *(f.name for f in PrivacySettings._meta.concrete_fields if f.name != "invisible"),
        ),
        "Contact": _rows(Contact.objects.all()),
        "Block": _rows(Block.objects.all()),
        "LastSeen": _rows(LastSeen.objects.all()),
        "users": _rows(get_user_model()._default_manager.all()),
    }
    if feed_installed():
        from presence.feed.models import Activity, Group, Membership, Mention

        for model in (Activity, Group, Membership, Mention):
            rows[model.__name__] = _rows(model.objects.all())
    return rows


def views_of(connection: Any) -> dict[str, Any]:
    """What an open connection (the consumer) was last sent and watches, in the hub."""
    hub = Hub.current()
    assert hub is not None
    return {
        "sent": dict(connection.sent),
        "watching": {
            uid for uid, watchers in hub.registry.watchers.members.items() if connection in watchers
        },
        "topics": {
            kind: hub.topics_of(connection, kind) for kind in list(hub.registry.topics.members)
        },
    }


def consumer_of(user: Any) -> Any:
    hub = Hub.current()
    assert hub is not None
    (connection,) = [c for c in hub.registry.connections if c.viewer_id == user.pk]
    return connection
