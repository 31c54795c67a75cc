"""The pure rules of rooms: names, meta, who is counted and listed, in which order."""

from __future__ import annotations

import pytest

from presence import domain
from presence.domain.rooms import (
    MAX_META_BYTES,
    Candidate,
    Room,
    is_counted,
    is_listed,
    is_valid_kind,
    order_listed,
    parse_meta,
    parse_room,
    shown_meta,
)

ONLINE = domain.Presence(status=domain.Status.ONLINE)
HIDDEN = domain.HIDDEN


@pytest.mark.parametrize(
    ("value", "room"),
    [
        ("post:42", Room("post", "42")),
        ("a:b", Room("a", "b")),
        ("doc-type_2:x:y/z", Room("doc-type_2", "x:y/z")),
        (("post", 42), Room("post", "42")),
        (["group", "7"], Room("group", "7")),
        ("post:" + "x" * 64, Room("post", "x" * 64)),
        ("post:café", Room("post", "café")),
    ],
)
def test_room_names_parse(value: object, room: Room) -> None:
    assert parse_room(value) == room
    assert parse_room(room.kind, room.id) == room


@pytest.mark.parametrize(
    "value",
    [
        "post",
        "post:",
        ":42",
        "Post:42",
        "1post:42",
        "po st:42",
        "post:4 2",
        "post:4\t2",
        "post:4\n2",
        "post:" + "x" * 65,
        "post:\ud800",
        "post:\x00",
        "post:\u200b",  # zero width space: not printable
        "k" * 33 + ":1",
        ("post", None),
        ("post", True),
        ("post", 4.2),
        ("post", "42", "x"),
        42,
        None,
        {"room": "post:42"},
    ],
)
def test_malformed_room_names_are_refused(value: object) -> None:
    with pytest.raises(domain.InvalidInput) as error:
        parse_room(value)
    assert error.value.code == "invalid_value"


def test_kinds() -> None:
    assert is_valid_kind("post") and is_valid_kind("a-b_c9")
    assert not is_valid_kind("") and not is_valid_kind("Post") and not is_valid_kind(3)


def test_meta_is_an_object_of_at_most_512_bytes() -> None:
    assert parse_meta(None) is None
    assert parse_meta({"mode": "editing"}) == '{"mode":"editing"}'
    assert parse_meta({"é": "日本"}) == '{"é":"日本"}'
    biggest = {"k": "x" * (MAX_META_BYTES - len('{"k":""}'))}
    assert len(parse_meta(biggest) or "") == MAX_META_BYTES
    with pytest.raises(domain.InvalidInput) as too_big:
        parse_meta({"k": "x" * MAX_META_BYTES})
    assert too_big.value.code == "invalid_value"
    # Multi-byte characters count as their UTF-8 bytes.
    with pytest.raises(domain.InvalidInput):
        parse_meta({"k": "é" * 260})


@pytest.mark.parametrize("meta", [[], "editing", 3, True, ["a"]])
def test_meta_that_is_not_an_object(meta: object) -> None:
    with pytest.raises(domain.InvalidInput) as error:
        parse_meta(meta)
    assert error.value.code == "invalid_message"


@pytest.mark.parametrize("meta", [{"k": "\ud800"}, {"\udfff": 1}, {"k": float("nan")}])
def test_meta_with_lone_surrogates_or_nan(meta: object) -> None:
    with pytest.raises(domain.InvalidInput) as error:
        parse_meta(meta)
    assert error.value.code == "invalid_value"


@pytest.mark.parametrize(
    "meta", [{"k": float("inf")}, {"k": [1, {"n": -float("inf")}]}, {"k": float("nan")}]
)
def test_meta_with_a_number_out_of_range_is_told_so(meta: object) -> None:
    # {"k": 1e400} is valid JSON, which Python reads as inf: not a lone surrogate
    with pytest.raises(domain.InvalidInput) as error:
        parse_meta(meta)
    assert error.value.code == "invalid_value"
    assert "out of range" in error.value.message and "surrogate" not in error.value.message


def test_meta_with_a_lone_surrogate_is_told_so_beside_a_number_in_range() -> None:
    with pytest.raises(domain.InvalidInput) as error:
        parse_meta({"k": "\ud800", "n": 1e300})
    assert "surrogate" in error.value.message


def test_who_is_counted_and_listed() -> None:
    stranger = domain.STRANGER
    blocked = domain.Relation(blocked=True)
    assert is_counted(stranger, invisible=False)
    assert not is_counted(stranger, invisible=True)
    assert not is_counted(blocked, invisible=False)
    # The viewer is always counted and listed, invisible or not.
    assert is_counted(domain.SELF, invisible=True)
    assert is_listed(domain.SELF, HIDDEN)
    assert is_listed(stranger, ONLINE)
    assert not is_listed(stranger, HIDDEN)


def test_listing_order_viewer_contacts_then_join_time() -> None:
    candidates = [
        Candidate(1, joined_at=10),
        Candidate(2, joined_at=5),
        Candidate(3, joined_at=30, contact=True),
        Candidate(4, joined_at=40, is_self=True),
        Candidate(5, joined_at=20, contact=True),
        Candidate(6, joined_at=5),
    ]
    assert order_listed(candidates, 10) == [4, 5, 3, 2, 6, 1]
    assert order_listed(candidates, 3) == [4, 5, 3]
    assert order_listed([], 3) == []


def test_shown_meta_is_the_last_joined_connections() -> None:
    assert shown_meta([]) is None
    assert shown_meta([(1.0, '{"a":1}'), (3.0, None), (2.0, '{"b":2}')]) is None
    assert shown_meta([(1.0, '{"a":1}'), (2.0, '{"b":2}')]) == '{"b":2}'
