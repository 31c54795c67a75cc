"""Deeply nested JSON gets the same answer on every Python: its depth is measured before it is
parsed (presence.domain.nesting), where json's own RecursionError comes at about 1,000 levels
on Python 3.11 and somewhere past 2,000 on 3.12 and 3.13 (a 1,000-level frame was "nested too
deeply" on one and "not a JSON object" on the next)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from presence import domain
from presence.domain import InvalidInput
from presence.domain.nesting import MAX_JSON_DEPTH, nests_too_deeply

LIMITS = domain.Limits(
    text_max_length=140,
    emoji_max_length=16,
    max_expiry=3600,
    max_frame_bytes=65536,
    max_subscriptions=10,
)
TOO_DEEP = ("invalid_message", "The frame nests arrays or objects too deeply.")


def lists(depth: int) -> str:
    return "[" * depth + "]" * depth


def heartbeat_carrying(value: str) -> str:
    """A heartbeat frame with ``value`` in a field the protocol ignores (one level deeper)."""
    return '{"type": "heartbeat", "pad": ' + value + "}"


def refusal(text: str) -> tuple[str, str]:
    with pytest.raises(InvalidInput) as info:
        domain.parse_frame(text, LIMITS)
    return info.value.code, info.value.message


@pytest.mark.parametrize(
    "text",
    [
        lists(MAX_JSON_DEPTH + 1),  # any Python parses this: the limit is presence's own
        heartbeat_carrying(lists(MAX_JSON_DEPTH)),
        "{" + '"a":{' * 1500 + "}" * 1501,  # past 3.11's RecursionError, not 3.12's
        lists(1500),
        lists(30_000),  # past every Python's
        "[" * 5000,  # deep and never closed: refused for its depth too
    ],
)
def test_every_python_answers_deep_nesting_alike(text: str) -> None:
    assert refusal(text) == TOO_DEEP


def test_nesting_up_to_the_limit_is_read() -> None:
    assert domain.parse_frame(heartbeat_carrying(lists(MAX_JSON_DEPTH - 1)), LIMITS) == (
        domain.Heartbeat()
    )
    assert refusal(lists(MAX_JSON_DEPTH)) == ("invalid_message", "Expected a JSON object.")


@pytest.mark.parametrize(
    "text",
    [
        heartbeat_carrying('"' + "[{" * 5000 + '"'),  # brackets in a string are text
        heartbeat_carrying('"\\"' + "[" * 500 + '\\\\"'),  # escaped quotes stay in the string
        heartbeat_carrying("[" + ",".join(["[1]"] * 3000) + "]"),  # many, side by side
    ],
)
def test_brackets_that_do_not_nest_are_not_counted(text: str) -> None:
    assert domain.parse_frame(text, LIMITS) == domain.Heartbeat()


@pytest.mark.parametrize(
    ("text", "deep"),
    [
        ("", False),
        (lists(MAX_JSON_DEPTH), False),
        (lists(MAX_JSON_DEPTH + 1), True),
        ('"' + "[" * 1000 + '" ' + lists(3), False),
        ('"\\\\"' + lists(MAX_JSON_DEPTH + 1), True),  # the string ended at its second quote
        (lists(MAX_JSON_DEPTH + 1).encode(), True),
        ("[" * 90 + '"é€😀' + "]" * 90 + '"', False),
        (("[" * 90 + '"é€😀' + "[" * 20).encode(), True),
    ],
)
def test_depth_is_measured_strings_aside_in_text_and_bytes(text: str | bytes, deep: bool) -> None:
    assert nests_too_deeply(text) is deep


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 1500, 2000])
def test_an_http_body_nested_too_deeply_is_not_read(
    make_user: Callable[..., Any], depth: int
) -> None:
    client = Client()
    client.force_login(make_user())
    response = client.post("/presence/api/status", lists(depth), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
