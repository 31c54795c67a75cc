"""The oracle's comparison, free of I/O: a client's view against what ``bulk_presence`` says
that viewer may see now.

While a user stays online their last seen moves with every heartbeat and no diff is sent for it
(docs/websocket.md), so two online presences are compared without it, as the server decides
what is news (``presence.domain.visibly_differs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tools.loadtest.generator import PresenceTuple, reveals

#: (connection index, viewer, view)
View = tuple[int, int, Mapping[int, PresenceTuple]]


def agrees(shown: PresenceTuple | None, expected: PresenceTuple) -> bool:
    if shown is None:
        return False
    if shown[0] != "offline" and expected[0] != "offline":
        return shown[:1] + shown[2:] == expected[:1] + expected[2:]
    return shown == expected


@dataclass
class Comparison:
    views: int = 0
    entries: int = 0
    #: connections with at least one entry differing from the oracle
    wrong: list[int] = field(default_factory=list)
    wrong_entries: int = 0
    #: (viewer, target) pairs where the oracle itself shows a hidden user something
    oracle_leaks: list[tuple[int, int]] = field(default_factory=list)
    examples: list[tuple[int, int, PresenceTuple | None, PresenceTuple]] = field(
        default_factory=list
    )


def compare(
    views: Iterable[View],
    expected: Mapping[int, Mapping[int, PresenceTuple]],
    hidden: set[int],
    blocked_pairs: set[tuple[int, int]],
    examples: int = 5,
) -> Comparison:
    """``expected``: by viewer, each target's presence as the oracle resolves it now."""
    result = Comparison()
    for index, viewer, view in views:
        result.views += 1
        truth = expected.get(viewer, {})
        differs = False
        for target, presence in truth.items():
            result.entries += 1
            hides = target in hidden or (viewer, target) in blocked_pairs
            if target != viewer and hides and reveals(presence):
                result.oracle_leaks.append((viewer, target))
            shown = view.get(target)
            if not agrees(shown, presence):
                differs = True
                result.wrong_entries += 1
                if len(result.examples) < examples:
                    result.examples.append((viewer, target, shown, presence))
        if differs:
            result.wrong.append(index)
    return result
