"""The load test's count of presence's signals: every server process logs each ``user_online``,
``user_offline``, ``room_entered`` and ``room_left`` it sends (one line, appended at once, so a
SIGKILL loses nothing written); once every client has left, each user's signals must alternate
online, offline, ... and end offline, and each (user, room)'s entered, left, ... and end left.
The same signal twice (one kind, one second) is *doubled*; a sequence that starts with the
ending kind, ends with the starting one once everyone has left, or has two of one kind at
different seconds in a row (the one between them missing), *lost* one.

Presence's Redis restarted empty (``--faults``) forgets who was online and in which rooms
(docs/operations.md): users still connected are recorded again, and sent user_online (and
room_entered) again without the end between; users who left meanwhile get no user_offline (nor
room_left). Those patterns alone, and only where the missing end falls in a restart's window
(given to :func:`check`), are *explained*: reported, not failed. A doubled signal never is.

Servers install :class:`SignalLogConfig` (tools/loadtest/settings.py) when
``LOADTEST_SIGNALS_DIR`` is set (tools/loadtest/__main__.py sets it).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from django.apps import AppConfig

LOG_ENV = "LOADTEST_SIGNALS_DIR"


class SignalLogConfig(AppConfig):
    name = "tools.loadtest"
    label = "loadtest_signals"

    def ready(self) -> None:
        from presence import signals

        directory = Path(os.environ[LOG_ENV])
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f"{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

        def log(kind: str) -> Any:
            def receiver(sender: Any, user_id: Any, at: Any, room: str = "", **kw: Any) -> None:
                # a room's signals are kept by (user, room): a room's name has no space
                key = f"{user_id}@{room}" if room else str(user_id)
                os.write(fd, f"{kind} {key} {at.timestamp():.0f} {os.getpid()}\n".encode())

            return receiver

        # held: signals keep weak references
        self.receivers = {kind: log(kind) for kind in ("online", "offline", "entered", "left")}
        signals.user_online.connect(self.receivers["online"])
        signals.user_offline.connect(self.receivers["offline"])
        signals.room_entered.connect(self.receivers["entered"])
        signals.room_left.connect(self.receivers["left"])


#: each kind's place at one second: an ending kind first (a stretch ends a second after its
#: start at the soonest, so an end at the same second ends the stretch before it)
STARTS = {"online": 1, "offline": 0, "entered": 1, "left": 0}


@dataclass
class SignalCheck:
    online: int = 0
    offline: int = 0
    users: int = 0
    entered: int = 0
    left: int = 0
    #: (user, room) pairs with a room signal
    stays: int = 0
    doubled: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    processes: int = 0
    #: sequences whose only faults are those a restart of presence's Redis (empty) makes around
    #: its window: a start sent again, an end missing (docs/operations.md): reported, not failed
    explained: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.doubled or self.lost)


def check(
    directory: Path, restarts: Sequence[tuple[float, float]] = (), slack: float = 0.0
) -> SignalCheck:
    """Each user's (and each user's in each room) signals, from every process's log, in the
    order they happened. ``restarts``: the (start, end) wall-clock times of each restart of
    presence's Redis (empty); an end missing between a start before a restart's end and the
    next start (if any) after its beginning, each within ``slack`` seconds, is what the
    restart explains."""
    by_key: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    result = SignalCheck()
    for path in sorted(directory.glob("*.log")):
        result.processes += 1
        for line in path.read_text().splitlines():
            kind, key, at, _pid = line.split()
            by_key[key].append((int(at), STARTS[kind], kind))
            setattr(result, kind, getattr(result, kind) + 1)
    result.stays = sum(1 for key in by_key if "@" in key)
    result.users = len(by_key) - result.stays

    def forgotten(after: int, before: int | None) -> bool:
        # The restart's window widened by ``slack`` (and a second: the log has whole seconds)
        # on both sides: signals queued before it are lost with its outbox, and the sockets
        # still open are recorded again after it.
        return any(
            after <= end + slack + 1 and (before is None or before >= start - slack - 1)
            for start, end in restarts
        )

    for key, events in by_key.items():
        ordered = sorted(events)
        kinds = [kind for _, _, kind in ordered]
        # Two in a row of one kind at the same second: one transition sent twice; at different
        # seconds: the transition between them was lost (a stretch without its start or its
        # end). A stretch without its end: a start followed by another start, or by nothing.
        twice = any(a == b for a, b in pairwise(ordered))
        skipped = [(a, b) for a, b in pairwise(ordered) if a[2] == b[2] and a != b]
        no_start = STARTS[kinds[0]] != 1 or any(STARTS[a[2]] == 0 for a, _ in skipped)
        no_end: list[tuple[int, int | None]] = [(a[0], b[0]) for a, b in skipped if STARTS[a[2]]]
        if STARTS[kinds[-1]] == 1:
            no_end.append((ordered[-1][0], None))
        sequence = f"{key}: {' '.join(kinds)}"
        if no_start or not all(forgotten(after, before) for after, before in no_end):
            result.lost.append(sequence)
        elif twice:
            result.doubled.append(sequence)
        elif no_end:
            result.explained.append(sequence)
    return result


def report(result: SignalCheck) -> str:
    line = (
        f"loadtest: signals: {result.online} user_online, {result.offline} user_offline of "
        f"{result.users} users, {result.entered} room_entered, {result.left} room_left of "
        f"{result.stays} (user, room) from {result.processes} processes; "
        f"lost {len(result.lost)}, doubled {len(result.doubled)}"
    )
    if result.explained:
        line += (
            f"; {len(result.explained)} more with a start sent again or an end missing around a "
            "restart of presence's Redis (empty): expected, not counted"
        )
    for sample in (result.lost + result.doubled)[:5]:
        line += f"\n  {sample}"
    return line
