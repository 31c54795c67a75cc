"""Where a server process's memory is: a census cheap enough to run through a soak.

A load test's daphne processes start :func:`start_census` (``tools/loadtest/settings.py``, when
``LOADTEST_MEMORY_DIR`` is set: a server's first start only, not a restart nor a floor's bare
server, ``servers.DaphneProcess.start_env``): a daemon thread appends one JSON line every
:data:`CENSUS_EVERY` seconds to ``memory-PID.jsonl`` in that folder. Nothing is traced (tracing
slows a server too much for its RSS to mean anything); each line is a handful of counters:

- ``rss``: the resident set, as the harness's RSS check reads it;
- ``malloc_used`` / ``malloc_free``: bytes glibc's allocator has handed out and bytes it holds
  free but has not given back (fragmentation, and high-water marks of bursts), over all arenas;
  ``malloc_mmap``: its large blocks mapped on their own;
- ``blocks``: Python's allocated memory blocks (objects and their buffers);
- ``linecache``: bytes of source lines :mod:`linecache` keeps for formatted tracebacks;
- ``threads``: the process's threads (each may take a malloc arena of its own).

:func:`breakdown` turns two samples into the growth of each, which the harness prints.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import linecache
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: seconds between samples: mallinfo2() walks every malloc arena, a fifth of a second on a
#: server's fragmented heap, which the servers' CPU figures would count as presence's
CENSUS_EVERY = 15.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc_mallinfo2() -> Any:
    """glibc's ``mallinfo2`` (2.33+), or None where there is none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


def _rss() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _linecache_bytes() -> int:
    total = 0
    for entry in list(linecache.cache.values()):
        if len(entry) == 4 and isinstance(entry[2], list):
            total += sum(len(line) for line in entry[2])
    return total


def sample(mallinfo2: Any = None) -> dict[str, float]:
    """One line of the census."""
    line: dict[str, float] = {
        "at": time.time(),
        "rss": _rss(),
        "blocks": sys.getallocatedblocks(),
        "linecache": _linecache_bytes(),
        "threads": threading.active_count(),
    }
    if mallinfo2 is not None:
        info = mallinfo2()
        line["malloc_used"] = info.uordblks
        line["malloc_free"] = info.fordblks
        line["malloc_mmap"] = info.hblkhd
    return line


def start_census(folder: str) -> None:
    """Append a sample to ``folder/memory-PID.jsonl`` every :data:`CENSUS_EVERY` seconds."""
    path = Path(folder) / f"memory-{os.getpid()}.jsonl"
    mallinfo2 = _libc_mallinfo2()

    def run() -> None:
        while True:
            with open(path, "a") as census:
                census.write(json.dumps(sample(mallinfo2)) + "\n")
            time.sleep(CENSUS_EVERY)

    threading.Thread(target=run, name="loadtest-memory-census", daemon=True).start()


def read_census(folder: Path, pid: int) -> list[dict[str, float]]:
    path = folder / f"memory-{pid}.jsonl"
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue  # a line cut short by a kill
    return lines


def at_or_after(census: list[dict[str, float]], moment: float) -> dict[str, float] | None:
    return next((line for line in census if line["at"] >= moment), None)


def breakdown(start: dict[str, float], end: dict[str, float]) -> str:
    """``rss +4.1 MB: malloc used +0.3, malloc free +2.9, …`` between two samples."""

    def mb(key: str) -> str:
        return f"{(end.get(key, 0) - start.get(key, 0)) / 2**20:+.1f}"

    parts = [f"rss {mb('rss')} MB"]
    if "malloc_used" in start and "malloc_used" in end:
        parts += [
            f"malloc used {mb('malloc_used')}",
            f"malloc free {mb('malloc_free')}",
            f"malloc mmap {mb('malloc_mmap')}",
        ]
    parts += [
        f"linecache {mb('linecache')}",
        f"Python blocks {end['blocks'] - start['blocks']:+,.0f}",
        f"threads {start['threads']:.0f}→{end['threads']:.0f}",
    ]
    return ", ".join(parts)
