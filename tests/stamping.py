"""Pages' stamps in tests that compare rendered HTML exactly: the dots' ``data-presence-since``
(presence.stamps) is left out, once checked (tests/core/test_stamps.py tests the stamp itself)."""

from __future__ import annotations

import re
from typing import Any

from presence import stamps

_SINCE = re.compile(r' data-presence-since="([^"]*)"')


def without_stamps(html: str, viewer: Any = None) -> str:
    """``html`` without its dots' stamps: one stamp for the whole page, and (with ``viewer``)
    one that proves its time to that viewer."""
    found = set(_SINCE.findall(html))
    assert len(found) <= 1, found
    if found and viewer is not None:
        assert stamps.accepted_time(found.pop(), viewer.pk) is not None
    return _SINCE.sub("", html)
