"""The load test's count of presence's signals: every server process logs each ``user_online``
and ``user_offline`` it sends (one line, appended at once, so a SIGKILL loses nothing written);
once every client has left, each user's signals must alternate online, offline, ... and end
offline. The same signal twice (one kind, one second) is *doubled*; a sequence that starts
offline, ends online once everyone has left, or has two of one kind at different seconds in a
row (the one between them missing), *lost* one.

Servers install :class:`SignalLogConfig` (tools/loadtest/settings.py) when
``LOADTEST_SIGNALS_DIR`` is set (tools/loadtest/__main__.py sets it).
"""

from __future__ import annotations

import os
from collections import defaultdict
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
            def receiver(sender: Any, user_id: Any, at: Any, invisible: bool, **kw: Any) -> None:
                os.write(fd, f"{kind} {user_id} {at.timestamp():.0f} {os.getpid()}\n".encode())

            return receiver

        self.receivers = [log("online"), log("offline")]  # held: signals keep weak references
        signals.user_online.connect(self.receivers[0])
        signals.user_offline.connect(self.receivers[1])


@dataclass
class SignalCheck:
    online: int = 0
    offline: int = 0
    users: int = 0
    doubled: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    processes: int = 0

    #: presence's Redis was restarted empty meanwhile: who was online is forgotten, so users
    #: still connected are sent user_online again (docs/operations.md): reported, not failed
    forgiven: bool = False

    @property
    def failed(self) -> bool:
        return bool(self.doubled or self.lost) and not self.forgiven


def check(directory: Path, redis_restarted: bool = False) -> SignalCheck:
    """Each user's signals, from every process's log, in the order they happened."""
    by_user: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    result = SignalCheck(forgiven=redis_restarted)
    for path in sorted(directory.glob("*.log")):
        result.processes += 1
        for line in path.read_text().splitlines():
            kind, user, at, _pid = line.split()
            # At one second an offline comes first: an online's own stretch ends a second later
            # at the soonest, so an offline at the same second ends the stretch before it.
            by_user[user].append((int(at), 0 if kind == "offline" else 1, kind))
            if kind == "online":
                result.online += 1
            else:
                result.offline += 1
    result.users = len(by_user)
    for user, events in by_user.items():
        ordered = sorted(events)
        kinds = [kind for _, _, kind in ordered]
        # Two in a row of one kind at the same second: one transition sent twice; at different
        # seconds: the transition between them was lost (an online stretch without its online).
        twice = [a == b for a, b in pairwise(ordered)]
        skipped = [a[2] == b[2] and a != b for a, b in pairwise(ordered)]
        if kinds[0] != "online" or kinds[-1] != "offline" or any(skipped):
            result.lost.append(f"{user}: {' '.join(kinds)}")
        elif any(twice):
            result.doubled.append(f"{user}: {' '.join(kinds)}")
    return result


def report(result: SignalCheck) -> str:
    line = (
        f"loadtest: signals: {result.online} user_online, {result.offline} user_offline of "
        f"{result.users} users from {result.processes} processes; lost {len(result.lost)}, "
        f"doubled {len(result.doubled)}"
    )
    if result.forgiven and (result.lost or result.doubled):
        line += " (presence's Redis was restarted empty: expected, not counted)"
    for sample in (result.lost + result.doubled)[:5]:
        line += f"\n  {sample}"
    return line
