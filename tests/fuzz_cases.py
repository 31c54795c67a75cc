"""What the fuzz tests (tests/live/test_fuzz_consumer.py, tests/core/test_fuzz_http.py) share:
hypothesis strategies, the one text rule, and a reader of other users' Redis state.

The rule for client text is written out here again from the docs (docs/http.md, "Text"), not
imported from presence, so that a mistake in presence cannot hide behind the same mistake here.
"""

from __future__ import annotations

import json
import os
import unicodedata
import uuid
from typing import Any

from hypothesis import strategies as st

from presence import signals, users

#: the largest id an integer key holds (docs/websocket.md: "positive integers")
MAX_INT_ID = 2**63 - 1
#: seed of the fuzz runs; another value explores other inputs (docs/development.md, "Fuzzing")
SEED = int(os.environ.get("PRESENCE_FUZZ_SEED", "0"))
#: multiplies the frames and requests of a run (PRESENCE_FUZZ_SCALE=10: ten times as many)
SCALE = max(1, int(os.environ.get("PRESENCE_FUZZ_SCALE", "1")))

#: characters that have broken text handling somewhere: controls, NUL, lone surrogates, BOM,
#: bidirectional overrides, zero-width ones (refused and allowed), combining marks, digits of
#: other scripts, whitespace Python strips, astral characters, the separators of presence's
#: Redis members and of URLs
ODD_CHARACTERS = (
    "a",
    "Z",
    "0",
    "7",
    " ",
    "\t",
    "\n",
    "\r",
    "\x00",
    "\x1c",
    "\x7f",
    "\x85",
    "\xa0",
    "\u200b",  # ZERO WIDTH SPACE (Cf: refused)
    "\u200c",  # ZERO WIDTH NON-JOINER (Cf: allowed)
    "\u200d",  # ZERO WIDTH JOINER (Cf: allowed)
    "\u202e",  # RIGHT-TO-LEFT OVERRIDE (Cf: refused)
    "\u2066",  # LEFT-TO-RIGHT ISOLATE (Cf: refused)
    "\ufeff",  # BOM (Cf: refused)
    "\u3000",  # IDEOGRAPHIC SPACE (stripped)
    "\u0645",  # Arabic letter
    "\u05d0",  # Hebrew letter
    "\u0301",  # combining acute accent
    "\u0661",  # ARABIC-INDIC DIGIT ONE
    "\xb2",  # SUPERSCRIPT TWO (isdigit, but not for int())
    "\u0130",  # İ: lower() makes two characters
    "\ud800",  # lone high surrogate
    "\udfff",  # lone low surrogate
    "\ufffd",
    "\uffff",
    "\U0001f600",
    "\U0001f3f4",  # black flag (of subdivision flags)
    "\U000e0067",  # TAG LATIN SMALL LETTER G (Cf: allowed)
    "\U000e007f",  # CANCEL TAG (Cf: allowed)
    "\U0010ffff",
    "%",
    ":",
    ",",
    "/",
    "?",
    "#",
    "&",
    "=",
    "+",
    "@",
    ".",
    "-",
    "_",
    '"',
    "\\",
    "{",
    "[",
)

odd_text = st.text(
    alphabet=st.one_of(st.sampled_from(ODD_CHARACTERS), st.characters()), max_size=12
)

#: integers at and around every boundary a pk or a count has
edge_ints = st.one_of(
    st.sampled_from(
        [0, 1, -1, 2**31 - 1, 2**31, 2**53 + 1, MAX_INT_ID, MAX_INT_ID + 1, 2**64, -(2**63)]
    ),
    st.integers(),
    st.integers(min_value=10**20, max_value=10**60),
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    edge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    odd_text,
)

#: any JSON value (NaN and Infinity included: Python's json reads and writes them)
junk_json = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(odd_text, children, max_size=3)
    ),
    max_leaves=6,
)


def dumps(value: Any, ascii_only: bool) -> str:
    """JSON text as clients write it: escaped to ASCII, or raw (lone surrogates and all)."""
    return json.dumps(value, ensure_ascii=ascii_only)


#: invisible format characters real text needs (docs/http.md, "Text")
ALLOWED_FORMAT = frozenset(["\u200c", "\u200d", *(chr(c) for c in range(0xE0020, 0xE0080))])


def refused_text(value: str, *, multiline: bool = False) -> bool:
    """Whether the one text rule refuses ``value``: lone surrogates, control characters (but
    line breaks and tabs in multi-line text), invisible format characters but ALLOWED_FORMAT."""
    for ch in value:
        category = unicodedata.category(ch)
        if category == "Cs":
            return True
        if category == "Cc" and not (multiline and ch in "\n\t"):
            return True
        if category == "Cf" and ch not in ALLOWED_FORMAT:
            return True
    return False


def int_pk(value: Any) -> int | None:
    """What an integer-keyed site reads ``value`` (a JSON number or string) as: the pk, or None
    when it cannot be one (docs/websocket.md, "subscribe")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_INT_ID else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        number = int(value)
        return number if number <= MAX_INT_ID else None
    return None


def uuid_pk(value: Any) -> uuid.UUID | None:
    """What a UUID-keyed site reads ``value`` as (any spelling Python's UUID reads), or None."""
    if not isinstance(value, str) or not 0 < len(value) <= 255:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


#: beginnings of one user's own keys (the user id in place of {}) beside the live state
#: (docs/redis-layout.md), and the whole name of one
OWN_KEYS = ("presence:http-rate:{}:", "presence:http-read:{}:", "presence:ended-session:{}:")
OWN_KEY = "presence:account-changed:{}"


def redis_of_others(client: Any, actors: list[Any]) -> dict[str, Any]:
    """Every presence key's content but the fuzzing users' own members and fields.

    A transition's signal-outbox entry (in a shard's outbox, whoever made it) is claimed (a
    ZREM) on the receivers' thread after the write, late on a busy machine: earlier work is let
    finish first, so that an entry on its way out is not taken for a change to others."""
    signals.wait_sent()
    own = [str(users.encode_id(actor.pk)) for actor in actors]

    def stamped_users(member: str) -> tuple[str, ...]:
        """The users a change stamp's member is of: '<kind>:<id>', a relation's or a block's
        pair 'p:<length>:<id><other>' / 'b:...' (both users: an actor's follow or block
        stamps the other party's view of them; presence.store.plans.changes), or the member
        itself."""
        kind, _, rest = member.partition(":")
        if kind.isdigit() and rest:
            return (rest,)
        if kind in ("p", "b"):
            length, _, ids = rest.partition(":")
            if length.isdigit():
                raw = ids.encode()
                cut = int(length)
                return (raw[:cut].decode(errors="replace"), raw[cut:].decode(errors="replace"))
        return (member,)

    #: the kinds a relation or a block between an actor and another user stamps on the other
    #: (presence.domain.Kind.RELATION, BLOCK): theirs, but the actor's doing (the other users'
    #: own rows, Contact and Block, are compared apart and must not change)
    relation_kinds = ("16:", "32768:")

    def mine(member: Any) -> bool:
        text = str(member)
        if text.startswith(relation_kinds):
            return True
        return any(text == o or text.startswith(o + ":") or o in stamped_users(text) for o in own)

    dump: dict[str, Any] = {}
    for key in sorted(client.scan_iter("presence:*")):
        if any(
            key == OWN_KEY.format(o) or key.startswith(tuple(p.format(o) for p in OWN_KEYS))
            for o in own
        ):
            continue  # a fuzzing user's own limits' windows and marks of logouts
        kind = client.type(key)
        if kind == "zset":
            dump[key] = [e for e in client.zrange(key, 0, -1, withscores=True) if not mine(e[0])]
        elif kind == "hash":
            dump[key] = {f: v for f, v in client.hgetall(key).items() if not mine(f)}
        elif kind == "set":
            dump[key] = sorted(m for m in client.smembers(key) if not mine(m))
        else:
            dump[key] = (kind, client.dump(key))
    return {key: value for key, value in dump.items() if value}
