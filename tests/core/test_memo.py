"""presence.memo: a bounded memo whose entries the garbage collector does not walk."""

from __future__ import annotations

import gc
import json

import pytest

from presence.memo import BoundedMemo, bounded_memo


def test_each_key_is_computed_once_while_it_is_kept() -> None:
    calls: list[str] = []

    @bounded_memo(4)
    def quoted(value: str) -> str:
        calls.append(value)
        return json.dumps(value)

    assert [quoted("a"), quoted("b"), quoted("a")] == ['"a"', '"b"', '"a"']
    assert calls == ["a", "b"]
    assert quoted.__name__ == "quoted"


def test_never_holds_more_than_its_bound() -> None:
    memo = BoundedMemo(str, maxsize=3)
    for number in range(10):
        assert memo(number) == str(number)
        assert len(memo.entries) <= 3
    memo.cache_clear()
    assert memo.entries == {}


def test_strings_kept_are_not_walked_by_the_collector() -> None:
    # The reason it replaces functools.lru_cache, whose every entry is a list in sight.
    memo = BoundedMemo(json.dumps, maxsize=100)
    for number in range(50):
        memo(f"user{number}")
    gc.collect()
    assert not gc.is_tracked(memo.entries)


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="maxsize must be at least 1"):
        BoundedMemo(str, maxsize=0)
