"""The pure rules of the activity feed, free of I/O: post text, ``@mentions`` and cursors.

Kept apart from :mod:`presence.domain` (presence's rules) but in the same style: plain functions
raising :class:`presence.domain.InvalidInput` with a contract error code.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Generic, TypeVar

from django.utils.translation import gettext

from presence.domain import InvalidInput, check_text

T = TypeVar("T")

# --- post text ------------------------------------------------------------------------------


def clean_text(text: object, max_length: int) -> str:
    """A post's text, stripped, with line breaks normalized to ``\\n``.

    Raises InvalidInput: ``invalid_message`` (not a string), ``invalid_value`` (empty, too long,
    text :func:`presence.domain.check_text` refuses with line breaks and tabs allowed).
    """
    if not isinstance(text, str):
        raise InvalidInput("invalid_message", gettext("'text' must be a string."))
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    if not text:
        raise InvalidInput("invalid_value", gettext("Write something first: the post is empty."))
    # Surrogates, control characters other than line breaks and tabs, invisible format
    # characters (the one rule, presence.domain.check_text).
    check_text(text, "text", multiline=True)
    if len(text) > max_length:
        raise InvalidInput(
            "invalid_value",
            gettext("The post is %(length)d characters long; at most %(limit)d.")
            % {"length": len(text), "limit": max_length},
        )
    return text


# --- mentions -------------------------------------------------------------------------------

#: Characters of a mentionable username: Django's username characters except ``@``.
_NAME = r"[\w.+-]"
#: An ``@`` starts a mention at the start of the text or after a character that cannot come
#: right before the ``@`` of an e-mail address, a URL or another mention (so ``a@b.com``,
#: ``x.org/@bob``, ``x.org/#@bob``, ``?a=1&@bob`` and ``@@bob`` mention nobody), nor after a
#: backtick (code: ``@property`` between backticks is no mention).
_MENTION_RE = re.compile(rf"(?<![\w.+\-@/=#&?`])@({_NAME}+)")
#: characters at which a name may end early: ``@bob.`` (end of a sentence) mentions bob
_SEPARATORS = frozenset("._+-")
#: Django's default username max_length
MAX_NAME_LENGTH = 150


@dataclass(frozen=True)
class MentionCandidate:
    """An ``@`` that may mention someone: the typed names it may stand for, longest first."""

    #: index of the ``@`` in the text
    start: int
    names: tuple[str, ...]


def mention_candidates(text: str) -> list[MentionCandidate]:
    """Every ``@name`` of ``text`` with the names it may stand for.

    After the ``@`` comes a run of username characters (letters, digits, ``_ . + -``); the run
    and each of its prefixes that end before a ``. _ + -`` are candidates, longest first: in
    ``@john.doe.`` they are ``john.doe.``, ``john.doe`` and ``john``; the longest that names a
    user wins (see :func:`resolve_mentions`). Anything else (space, comma, ``'``, ``!``, ``)``,
    ``@``...) ends the name.
    """
    found: list[MentionCandidate] = []
    for match in _MENTION_RE.finditer(text):
        run = match.group(1)[:MAX_NAME_LENGTH]
        names = [run] + [run[:end] for end in range(len(run) - 1, 0, -1) if run[end] in _SEPARATORS]
        found.append(MentionCandidate(match.start(), tuple(names)))
    return found


def candidate_names(text: str) -> list[str]:
    """All names the mentions of ``text`` may stand for, without repeats: every mention's
    longest name (in text order), then every mention's next one, and so on. A caller that
    looks up only the first N looks up each mention's likeliest names before any mention's
    shorter ones: a long run of separators (``@a.a.a.a...``, a prefix per dot) cannot crowd
    out the mentions after it."""
    candidates = [c.names for c in mention_candidates(text)]
    deepest = max((len(names) for names in candidates), default=0)
    return list(
        dict.fromkeys(
            names[rank] for rank in range(deepest) for names in candidates if rank < len(names)
        )
    )


@dataclass(frozen=True)
class MentionSpan(Generic[T]):
    """``text[start:end]`` (``@`` included) mentions ``target``."""

    start: int
    end: int
    target: T


def _fold_char(char: str) -> str:
    """``char`` with its case folded, one character for one: an ASCII letter to lower case; any
    other character to its case fold, or else its lower case, if that is one character and not
    ASCII (so the Kelvin sign never equals ``k``: a database matching ASCII names ignoring case
    does not equate them either); else ``char`` itself."""
    if char.isascii():
        return char.lower()
    for folded in (char.casefold(), char.lower()):
        if len(folded) == 1 and not folded.isascii():
            return folded
    return char


def fold_case(name: str) -> str:
    """``name`` with its case folded letter by letter: two handles that fold alike are the same
    ignoring case (``Émile`` and ``éMILE``; not ``Straße`` and ``STRASSE``)."""
    return "".join(map(_fold_char, name))


@cache
def _bmp_case_mates() -> dict[str, frozenset[str]]:
    """Non-ASCII characters of the Basic Multilingual Plane that fold alike, by their fold:
    the groups that upper and lower case alone do not link (Greek sigma's final form, the
    symbol forms of theta, Cyrillic's old letter forms)."""
    mates: dict[str, set[str]] = {}
    for point in range(0x80, 0x10000):
        char = chr(point)
        folded = _fold_char(char)
        if folded != char:
            mates.setdefault(folded, {folded}).add(char)
    return {folded: frozenset(chars) for folded, chars in mates.items()}


def case_mates(char: str) -> frozenset[str]:
    """Every character that folds as ``char`` does (``char`` included)."""
    folded = _fold_char(char)
    if char.isascii():
        return frozenset({folded, folded.upper()})
    found = _bmp_case_mates().get(folded)
    if found is not None:
        return found
    # Past the BMP, case maps one letter to one: upper and title case find the rest.
    variants = (char, folded, folded.upper(), folded.title())
    return frozenset(v for v in variants if len(v) == 1 and _fold_char(v) == folded)


def any_case_pattern(name: str) -> str:
    """A case-sensitive regular expression matching exactly the texts that fold as ``name``
    does, letter by letter (``^[Éé][Mm]...$``): the same on SQLite (Python's ``re``) and
    PostgreSQL (``~``), whose own case-insensitive matching of non-ASCII letters differ."""
    parts = []
    for char in name:
        mates = case_mates(char)
        if len(mates) > 1 or not (char.isalnum() or char in "_-"):
            parts.append("[" + "".join(sorted(mates)) + "]")
        else:
            parts.append(char)
    return "^" + "".join(parts) + "$"


def handle_lookup(users: Iterable[tuple[str, T]]) -> Callable[[str], list[T]]:
    """A resolver over ``(handle, user)`` pairs: the users whose handle is the name exactly,
    else those whose handle is the name ignoring case (:func:`fold_case`). More than one user is
    an ambiguous name (see :func:`resolve_mentions`)."""
    exact: dict[str, list[T]] = {}
    folded: dict[str, list[T]] = {}
    for handle, target in users:
        exact.setdefault(handle, []).append(target)
        folded.setdefault(fold_case(handle), []).append(target)

    def lookup(name: str) -> list[T]:
        return exact.get(name) or folded.get(fold_case(name), [])

    return lookup


def resolve_mentions(text: str, lookup: Callable[[str], Sequence[T]]) -> list[MentionSpan[T]]:
    """The mentions of ``text``: for each ``@``, its longest candidate name that ``lookup``
    knows decides. Naming one user, it mentions them; naming several (an ambiguous name), it
    mentions nobody, and no shorter name is tried (``@bob.smith`` never stands for ``bob``
    when a ``bob.smith`` exists). Unknown names are left as text. A user mentioned twice gives
    two spans."""
    spans: list[MentionSpan[T]] = []
    for candidate in mention_candidates(text):
        for name in candidate.names:
            targets = lookup(name)
            if targets:
                if len(targets) == 1:
                    end = candidate.start + 1 + len(name)
                    spans.append(MentionSpan(candidate.start, end, targets[0]))
                break
    return spans


def unique_targets(spans: Iterable[MentionSpan[T]], key: Callable[[T], object]) -> list[T]:
    """The mentioned targets in text order, each once."""
    seen: dict[object, T] = {}
    for span in spans:
        seen.setdefault(key(span.target), span.target)
    return list(seen.values())


# --- cursors --------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CURSOR_RE = re.compile(r"(-?\d{1,18})\.(\d{1,19})")
#: longest cursor accepted, in characters
MAX_CURSOR_LENGTH = 64


@dataclass(frozen=True, order=True)
class Position:
    """Where a page ends: the (created_at, id) key of its last (oldest) activity. The next page
    starts strictly below it, so activities posted meanwhile never shift later pages."""

    created_at: datetime
    id: int


def encode_cursor(position: Position) -> str:
    """An opaque, URL-safe token for ``position`` (base64 of microseconds since the epoch and
    the id)."""
    micros = (position.created_at - _EPOCH) // timedelta(microseconds=1)
    raw = f"{micros}.{position.id}".encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str | None) -> Position | None:
    """The position a cursor stands for; None for no cursor (the first page).

    Raises InvalidInput ``invalid_cursor`` for anything :func:`encode_cursor` did not make.
    """
    if cursor is None or cursor == "":
        return None
    invalid = InvalidInput(
        "invalid_cursor", gettext("The cursor is not valid: use the one a page returned.")
    )
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_LENGTH or not cursor.isascii():
        raise invalid
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        raise invalid from None
    match = _CURSOR_RE.fullmatch(raw)
    if match is None:
        raise invalid
    try:
        created_at = _EPOCH + timedelta(microseconds=int(match.group(1)))
    except OverflowError:
        raise invalid from None
    activity_id = int(match.group(2))
    if (
        activity_id < 1
        or activity_id >= 2**63
        or encode_cursor(Position(created_at, activity_id)) != cursor
    ):
        raise invalid
    return Position(created_at, activity_id)
