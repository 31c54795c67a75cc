"""api.online_count() at N users online (1,000,000; --quick 100,000), side by side with a scan of
the buckets (``live_user_ids()``, what the admin's "online now" reads), in one run.

Setup (not measured): N users online now in the buckets, and the online ledger as the writes'
scripts leave it (each user by the time they turn offline: last active + ONLINE_WINDOW), written
straight to Redis with the store's key scheme. Then a real touch of one more user checks that
the ledger written is the one the scripts keep (the count goes up by one), and both reads must
agree on the number.

Reported: each read's median time and its Redis commands, the ratio, and the ledger's memory per
user online.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import (
    ID_RANGES,
    Report,
    Sizes,
    activity_scores,
    command_stats,
    fill_buckets,
    flush,
    median,
    ms,
    raw_client,
    say,
    store,
    timed,
)
from presence import api, copies
from presence.api._reading import live_user_ids
from presence.domain import Device
from presence.store import decode_score
from presence.users import encode_id

NAME = "online_count"
FIRST_ID = ID_RANGES[NAME].start  # outside the id ranges of the other benchmarks
COUNT_RUNS = 200
SCAN_RUNS = 3


def fill_ledger(client: Any, scores: dict[Any, int], window: int, chunk: int = 10_000) -> None:
    """The ledger as the scripts write it for users seen by page views (lua/ledger.lua)."""
    s = store()
    by_key: dict[str, list[Any]] = {}
    for uid, score in scores.items():
        key = s.keys.user_ledger_keys(uid)[0]
        last_active = decode_score(score).last_active or 0
        by_key.setdefault(key, []).extend((int(last_active) + window, encode_id(uid)))
    pipe = client.pipeline(transaction=False)
    for key, args in by_key.items():
        for start in range(0, len(args), 2 * chunk):
            pipe.execute_command("ZADD", key, *args[start : start + 2 * chunk])
            if len(pipe) >= 10:
                pipe.execute()
    pipe.execute()


def commands_of(client: Any, fn: Any) -> tuple[Any, int]:
    before = command_stats(client)
    result = fn()
    after = command_stats(client)
    calls = sum(
        calls - before.get(name, (0, 0))[0]
        for name, (calls, _) in after.items()
        if name not in {"info"}
    )
    return result, calls


def run(sizes: Sizes, report: Report) -> None:
    n = sizes.population
    say(f"\n== online_count: {n:,} users online, side by side with a scan of the buckets ==")
    client = raw_client()
    s = store()
    now = int(time.time())
    flush(client)
    # Seeded from the database, as a live site's Redis is (presence.copies): a shard that lost
    # its copy of who is invisible takes a user it cannot tell for invisible meanwhile.
    copies.seed()
    window = s.conf.ONLINE_WINDOW
    scores = activity_scores(range(FIRST_ID, FIRST_ID + n), now, spread=60)
    started = time.perf_counter()
    fill_buckets(client, s, scores)
    fill_ledger(client, scores, window)
    elapsed = time.perf_counter() - started
    say(f"  setup: {n:,} users online written to Redis in {elapsed:.1f} s (not measured)")
    s.run(s.plans.touch(FIRST_ID + n, Device.WEB, time.time()))  # one more, by the real script
    n += 1

    counted, count_commands = commands_of(client, api.online_count)
    count_times = [timed(api.online_count)[0] for _ in range(COUNT_RUNS)]
    scanned, scan_commands = commands_of(client, lambda: len(live_user_ids()))
    scan_times = [timed(live_user_ids)[0] for _ in range(SCAN_RUNS)]
    if not counted == scanned == n:
        raise RuntimeError(f"online_count {counted:,}, the scan {scanned:,}, expected {n:,}")

    count_time, scan_time = median(count_times), median(scan_times)
    ledger_bytes = sum(
        int(client.memory_usage(s.keys.ledger_keys(shard)[0], samples=0) or 0)
        for shard in s.keys.shards()
    )
    report.add(NAME, f"online_count() at {n:,} online (median of {COUNT_RUNS})", ms(count_time))
    report.add(NAME, "online_count() Redis commands", f"{count_commands}", "bounded", None)
    report.add(NAME, f"scan of the buckets (median of {SCAN_RUNS})", ms(scan_time))
    report.add(NAME, "scan Redis commands", f"{scan_commands:,}")
    report.add(
        NAME,
        "scan / online_count",
        f"{scan_time / count_time:,.0f}x",
        ">= 1,000x at 1M",
        scan_time / count_time >= 1000,
    )
    report.add(NAME, "ledger memory per user online", f"{ledger_bytes / n:.0f} B")
    flush(client)
