"""How deeply a JSON text nests, measured before it is parsed.

``json.loads`` refuses deep nesting by a ``RecursionError`` whose threshold depends on the Python
version and on the stack already in use (about 1,000 levels on Python 3.11, somewhere between
2,000 and 30,000 on 3.12 and 3.13), so the same frame was "nested too deeply" on one Python and
"not an object" on the next. Measuring the depth first gives one answer on every Python, and
never lets the parser recurse that far."""

from __future__ import annotations

import re
from itertools import accumulate

#: the deepest nesting of arrays and objects read (a client frame of the protocol nests two
#: levels; the room above is for the frames a site's own apps add)
MAX_JSON_DEPTH = 100

#: a complete JSON string (its brackets are text, not nesting); unrolled, so long strings
#: cost one pass
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def nests_too_deeply(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``text`` (JSON, maybe invalid) opens more than ``limit`` arrays or objects
    inside one another, strings aside. Bytes are read as Latin-1: in UTF-8 the bytes of the
    brackets, quotes and backslash occur only as those characters."""
    # Most texts (every heartbeat) are shorter than the limit, or have fewer brackets than the
    # limit in all: no need to look further.
    if len(text) <= limit:
        return False
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit
