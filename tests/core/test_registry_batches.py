"""The hub registry's batch calls (presence.hub.registry.Membership): a connection's users added
and, at its close, discarded in one pass each, with the same answers as one call per user (the
keys it was the first member of, and the last), leaving no empty set on either side."""

from __future__ import annotations

from presence.hub.registry import Membership


class Conn:
    """A connection, as the registry sees it: something hashable."""


def test_add_all_names_the_keys_it_is_the_first_member_of() -> None:
    watchers = Membership[int](str)
    a, b = Conn(), Conn()
    assert watchers.add_all(a, [1, 2, 2]) == [1, 2]

    assert watchers.add_all(b, [2, 3]) == [3]

    assert watchers.members == {1: {a}, 2: {a, b}, 3: {b}}
    assert watchers.of == {a: {1, 2}, b: {2, 3}}


def test_add_all_of_nothing_leaves_no_empty_set() -> None:
    watchers = Membership[int](str)
    assert watchers.add_all(Conn(), []) == []
    assert watchers.of == {}


def test_discard_all_names_the_keys_it_was_the_last_member_of() -> None:
    watchers = Membership[int](str)
    a, b = Conn(), Conn()
    watchers.add_all(a, [1, 2])
    watchers.add_all(b, [2, 3])

    assert sorted(watchers.discard_all(a)) == [1]

    assert watchers.members == {2: {b}, 3: {b}}
    assert watchers.of == {b: {2, 3}}
    assert sorted(watchers.discard_all(b)) == [2, 3]
    assert watchers.members == {} and watchers.of == {}
    assert watchers.discard_all(b) == []  # closed twice: nothing left to discard
