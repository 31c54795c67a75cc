"""presence.feed.domain: post text, mention parsing and cursors (pure; no database)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from presence.domain import InvalidInput
from presence.feed.domain import (
    MAX_NAME_LENGTH,
    Position,
    any_case_pattern,
    candidate_names,
    clean_text,
    decode_cursor,
    encode_cursor,
    fold_case,
    handle_lookup,
    mention_candidates,
    resolve_mentions,
    unique_targets,
)

# --- post text ------------------------------------------------------------------------------


def test_clean_text_strips_and_normalizes_line_breaks() -> None:
    assert clean_text("  hello\r\nworld\ragain\n ", 500) == "hello\nworld\nagain"
    assert clean_text("tab\there", 500) == "tab\there"


@pytest.mark.parametrize("text", ["", "   ", "\n\t \r\n"])
def test_empty_text_is_invalid(text: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        clean_text(text, 500)
    assert raised.value.code == "invalid_value"
    assert raised.value.message == "Write something first: the post is empty."


def test_length_limit_counts_characters_after_stripping() -> None:
    assert clean_text(" " + "é" * 10 + " ", 10) == "é" * 10
    with pytest.raises(InvalidInput) as raised:
        clean_text("x" * 11, 10)
    assert raised.value.code == "invalid_value"
    assert raised.value.message == "The post is 11 characters long; at most 10."


@pytest.mark.parametrize("text", ["a\x00b", "bell\x07", "esc\x1b[0m", "del\x7f"])
def test_control_characters_are_invalid(text: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        clean_text(text, 500)
    assert raised.value.code == "invalid_value"


@pytest.mark.parametrize("text", [None, 42, ["hi"], {"text": "hi"}, b"hi"])
def test_text_must_be_a_string(text: object) -> None:
    with pytest.raises(InvalidInput) as raised:
        clean_text(text, 500)
    assert raised.value.code == "invalid_message"


# --- mention candidates ---------------------------------------------------------------------


def names(text: str) -> list[tuple[str, ...]]:
    return [c.names for c in mention_candidates(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@bob", [("bob",)]),
        ("hi @bob and @carol", [("bob",), ("carol",)]),
        (
            "@bob, @carol! (@dave) @erin's @frank? @gina: @hal;",
            [("bob",), ("carol",), ("dave",), ("erin",), ("frank",), ("gina",), ("hal",)],
        ),
        ("thanks @bob.", [("bob.", "bob")]),
        ("@john.doe. again", [("john.doe.", "john.doe", "john")]),
        ("@a_b-c+d", [("a_b-c+d", "a_b-c", "a_b", "a")]),
        ("@Élodie and @名前", [("Élodie",), ("名前",)]),
        ("line\n@bob\t@carol", [("bob",), ("carol",)]),
        ("hi,@bob", [("bob",)]),
        ("@bob@carol", [("bob",)]),  # the second @ follows a name character: not a mention
    ],
)
def test_mention_candidates(text: str, expected: list[tuple[str, ...]]) -> None:
    assert names(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "mail a@b.com",
        "first.last@example.org",
        "x+tag@example.org",
        "https://example.social/@bob",
        "key=@bob",
        "@@bob",
        "https://example.org/#@bob",  # a URL's fragment
        "https://example.org/?@bob",
        "https://example.org/?a=1&@bob",  # a URL's query
        "`@property`",  # code
        "@",
        "@ bob",
        "a @ b",
        "@!",
        "email@",
    ],
)
def test_not_mentions(text: str) -> None:
    assert mention_candidates(text) == []


def test_candidate_start_is_the_at_sign() -> None:
    text = "hey @bob"
    [candidate] = mention_candidates(text)
    assert text[candidate.start] == "@"


def test_overlong_names_are_cut_at_the_username_limit() -> None:
    [candidate] = mention_candidates("@" + "a" * 400)
    assert candidate.names == ("a" * MAX_NAME_LENGTH,)


def test_candidate_names_are_unique_in_text_order() -> None:
    assert candidate_names("@bob @carol. @bob @Bob") == ["bob", "carol.", "Bob", "carol"]


def test_a_long_run_of_separators_does_not_crowd_out_later_mentions() -> None:
    # Each dot makes a prefix a name: 70 names a run; every mention's longest first.
    first, second = "a." * 70, "b." * 70
    names = candidate_names(f"@{first} @{second} hi @bob")
    assert names[:3] == [first, second, "bob"] and len(names) > 100


# --- resolving mentions ---------------------------------------------------------------------


USERS = {
    "bob": "B",
    "carol": "C",
    "john.doe": "J",
    "john": "j",
    "Dave": "D",
    "Ann": "A1",
    "ann": "A2",
}


def resolved(text: str, known: dict[str, str] = USERS) -> list[tuple[str, str]]:
    spans = resolve_mentions(text, handle_lookup(known.items()))
    return [(text[s.start : s.end], s.target) for s in spans]


def test_known_names_resolve_unknown_names_stay_text() -> None:
    assert resolved("@bob meets @nobody and @carol") == [("@bob", "B"), ("@carol", "C")]


def test_trailing_punctuation_ends_the_name() -> None:
    assert resolved("ask @bob. Or @carol, or @bob!") == [
        ("@bob", "B"),
        ("@carol", "C"),
        ("@bob", "B"),
    ]


def test_the_longest_known_name_wins() -> None:
    assert resolved("@john.doe. and @john.smith") == [("@john.doe", "J"), ("@john", "j")]


def test_case_exact_first_else_unique_case_insensitive_match() -> None:
    # "dave" matches Dave only by case; "ANN" matches both Ann and ann: ambiguous, left as text;
    # "ann" and "Ann" match exactly.
    assert resolved("@dave @DAVE @ANN @ann @Ann") == [
        ("@dave", "D"),
        ("@DAVE", "D"),
        ("@ann", "A2"),
        ("@Ann", "A1"),
    ]


def test_a_name_of_several_users_mentions_nobody_and_no_shorter_name() -> None:
    # Two users share the handle "sam" (a handle field that is not unique): "@sam" and
    # "@sam.x" (no "sam.x": "sam" is tried) are ambiguous; so is "@ANN.b" ("ANN" names both Ann
    # and ann ignoring case), while "@ann.b" names ann exactly.
    pairs = [("sam", "S1"), ("sam", "S2"), ("bob", "B"), ("Ann", "A1"), ("ann", "A2")]
    text = "@sam @sam.x @bob @ANN.b @ann.b"
    spans = resolve_mentions(text, handle_lookup(pairs))
    assert [(text[s.start : s.end], s.target) for s in spans] == [("@bob", "B"), ("@ann", "A2")]


def test_the_longest_name_of_a_user_decides_even_if_it_is_not_mentioned() -> None:
    # "bob.smith" names a user: "@bob.smith" is theirs, never a mention of "bob" (whether or
    # not the post may mention bob.smith is the caller's business, not a reason to try "bob").
    pairs = [("bob", "B"), ("bob.smith", "BS")]
    text = "thanks @bob and @bob.smith."
    spans = resolve_mentions(text, handle_lookup(pairs))
    assert [(text[s.start : s.end], s.target) for s in spans] == [
        ("@bob", "B"),
        ("@bob.smith", "BS"),
    ]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("Bob", "bOB", True),
        ("Émile", "éMILE", True),
        ("ΟΔΥΣΣΕΥΣ", "οδυσσευς", True),  # the final sigma folds as the others do
        ("Ǆemal", "ǆemal", True),
        ("Straße", "STRASSE", False),  # one letter is never two
        ("\u212aate", "kate", False),  # the Kelvin sign is not an ASCII k
        ("\u017fam", "sam", False),  # nor is the long s an ASCII s
        ("bob", "bob.", False),
    ],
)
def test_fold_case_is_letter_by_letter(a: str, b: str, same: bool) -> None:
    assert (fold_case(a) == fold_case(b)) is same


@pytest.mark.parametrize("name", ["émile", "Ωmega.x+y-z_9", "οδυσσευς", "名前", "bob", "ǅemal"])
def test_any_case_pattern_matches_what_folds_alike(name: str) -> None:
    pattern = re.compile(any_case_pattern(name))
    others = {name.upper(), name.lower(), name.title(), name.swapcase(), name + "x", name[1:]}
    others |= {"ΟΔΥΣΣΕΥΣ", "Οδυσσευσ", "ÉMILE", "emile", "ΩMEGA.X+Y-Z_9", "ΩmegaXx+y-z_9"}
    for text in others | {name}:
        assert bool(pattern.search(text)) is (fold_case(text) == fold_case(name)), text


def test_unicode_names_resolve_ignoring_case() -> None:
    assert resolved("hi @émile and @ÉMILE", {"Émile": "E"}) == [("@émile", "E"), ("@ÉMILE", "E")]


def test_email_addresses_resolve_to_nothing_even_for_known_names() -> None:
    assert resolved("write to bob@carol.com or carol@bob") == []


def test_repeated_mentions_give_one_target_each() -> None:
    spans = resolve_mentions("@bob @carol @bob @BOB", handle_lookup(USERS.items()))
    assert len(spans) == 4
    assert unique_targets(spans, key=lambda target: target) == ["B", "C"]


# --- cursors --------------------------------------------------------------------------------


T = datetime(2030, 1, 7, 9, 30, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "position",
    [
        Position(T, 1),
        Position(T.replace(microsecond=0), 2**63 - 1),
        Position(datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), 7),
        Position(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), 7),
    ],
)
def test_cursor_round_trip(position: Position) -> None:
    cursor = encode_cursor(position)
    assert cursor.isascii() and "=" not in cursor and "/" not in cursor and "+" not in cursor
    assert decode_cursor(cursor) == position


def test_cursor_of_another_timezone_is_the_same_instant() -> None:
    local = T.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    assert decode_cursor(encode_cursor(Position(local, 5))) == Position(T, 5)


def test_no_cursor_is_the_first_page() -> None:
    assert decode_cursor(None) is None
    assert decode_cursor("") is None


def _b64(raw: str) -> str:
    import base64

    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "x",
        "!!!!",
        "é",
        "a" * 65,
        _b64("1.2.3"),
        _b64("abc.1"),
        _b64("1"),
        _b64("1.0"),  # ids are positive
        _b64("1.-5"),
        _b64("01.5"),  # not canonical
        _b64(" 1.5"),
        _b64("999999999999999999.5"),  # past year 9999
        _b64(f"1.{2**63}"),
        _b64("1.5") + "==",
    ],
)
def test_invalid_cursors(cursor: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        decode_cursor(cursor)
    assert raised.value.code == "invalid_cursor"
    assert raised.value.message == "The cursor is not valid: use the one a page returned."


def test_positions_order_like_the_timeline() -> None:
    older = Position(T, 9)
    same_time_lower_id = Position(T, 3)
    newer = Position(T + timedelta(microseconds=1), 1)
    assert same_time_lower_id < older < newer
