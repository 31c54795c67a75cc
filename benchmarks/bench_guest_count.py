"""The guest count (``COUNT_GUESTS``) against the real Redis: its error, and what an anonymous
request costs, side by side with a member's page view in the same run.

- **Error**: 10,000 distinct simulated guests (each a request with its own address, turned
  into the digest the middleware makes) added to the HyperLogLog buckets, on five different
  UTC days (five salts, so five independent samples of the estimator), then counted by
  ``api.guest_count()``; and the same 10,000 spread over the window's buckets (the count then
  merges 11 HyperLogLogs in one PFCOUNT).
- **Cost per request**: ``note_guest`` for 2,000 new guests through the middleware's own path,
  measured with Redis's INFO (commands and bytes in and out, per request) and its time;
  beside it, a member's throttled-through page view (``api.touch``) measured the same way.
- **Memory**: each bucket's MEMORY USAGE once it holds 10,000 guests, and the count's time.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory, override_settings

from benchmarks.common import Report, Sizes, flush, median, ms, raw_client, say, store
from presence import api
from presence.api._guests import note_guest, noted, visitor_digest
from presence.domain import Device
from presence.store import merge

NAME = "guest_count"
GUESTS = 10_000
DAYS = 5
REQUESTS = 2_000
FIRST_MEMBER = 60_000_001
HLL_STANDARD_ERROR = 0.0081


def requests(count: int, salt: int) -> list[Any]:
    factory = RequestFactory()
    agent = "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0"
    return [
        factory.get("/", REMOTE_ADDR=f"10.{salt}.{n // 250}.{n % 250}", HTTP_USER_AGENT=agent)
        for n in range(count)
    ]


def net(client: Any) -> tuple[int, int, int]:
    """Redis's commands processed and bytes in and out so far."""
    stats = client.info("stats")
    return (
        int(stats["total_commands_processed"]),
        int(stats["total_net_input_bytes"]),
        int(stats["total_net_output_bytes"]),
    )


def per_request(client: Any, calls: list[Any]) -> tuple[float, float, float, float]:
    """Commands, bytes in, bytes out and median seconds of each call (INFO's own share left
    out: one INFO before, one after)."""
    before = net(client)
    times = []
    for call in calls:
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    after = net(client)
    n = len(calls)
    # The second INFO is counted in the commands and its request in the bytes in; its reply
    # (several KB) is written after the counters are read.
    commands = (after[0] - before[0] - 1) / n
    return commands, (after[1] - before[1]) / n, (after[2] - before[2]) / n, median(times)


def run(sizes: Sizes, report: Report) -> None:
    say(f"\n== guest_count: {GUESTS:,} distinct guests, error and cost per request ==")
    client = raw_client()
    with override_settings(PRESENCE={"COUNT_GUESTS": True}):
        s = store()
        base = float(int(time.time()))
        errors = []
        for day in range(DAYS):
            flush(client)
            now = base + day * 86400
            digests = [visitor_digest(r, now) for r in requests(GUESTS, 1)]
            for start in range(0, GUESTS, 1000):
                s.run(merge([s.plans.note_guest(d, now) for d in digests[start : start + 1000]]))
            counted = s.run(s.plans.count_guests(now))
            errors.append((counted - GUESTS) / GUESTS)
            say(f"  day {day}: counted {counted:,} of {GUESTS:,} ({errors[-1]:+.2%})")
        mean_abs = statistics.mean(abs(e) for e in errors)
        report.add(
            NAME,
            f"error at {GUESTS:,} guests, {DAYS} salts (mean |error|, worst)",
            f"{mean_abs:.2%}, {max(errors, key=abs):+.2%}",
            f"within 3 x {HLL_STANDARD_ERROR:.2%}",
            all(abs(e) <= 3 * HLL_STANDARD_ERROR for e in errors),
        )
        bucket_bytes = int(client.memory_usage(s.keys.guest_key(s.plans.guest_bucket(now))) or 0)
        report.add(NAME, f"memory of one bucket holding {GUESTS:,}", f"{bucket_bytes:,} B")

        # The same guests spread over the window: the count merges every bucket.
        flush(client)
        window, length = s.conf.ONLINE_WINDOW, s.keys.guest_bucket_seconds()
        now = base
        spread = [
            s.plans.note_guest(d, now - (i % (window // length)) * length)
            for i, d in enumerate(digests)
        ]
        for start in range(0, GUESTS, 1000):
            s.run(merge(spread[start : start + 1000]))
        keys = len(s.plans.guest_keys(now))
        counted = s.run(s.plans.count_guests(now))
        count_time = median(_timed_count(s, now) for _ in range(50))
        report.add(
            NAME,
            f"count over {keys} buckets (PFCOUNT of {keys} keys)",
            f"{counted:,} ({(counted - GUESTS) / GUESTS:+.2%}); {ms(count_time)}",
        )

        # Cost per request: the middleware's path for new guests, beside a member's touch.
        flush(client)
        noted.claim(s, -1, "")  # start the process's memory afresh
        guests = [(lambda r=r: note_guest(r, AnonymousUser())) for r in requests(REQUESTS, 2)]
        g_cmds, g_in, g_out, g_time = per_request(client, guests)
        members = [
            (lambda uid=uid: api.touch(uid, Device.WEB.value))
            for uid in range(FIRST_MEMBER, FIRST_MEMBER + REQUESTS)
        ]
        m_cmds, m_in, m_out, m_time = per_request(client, members)
        report.add(
            NAME,
            "a new guest's request: Redis commands, bytes in/out, time",
            f"{g_cmds:.1f} cmds (1 round trip), {g_in:.0f} B / {g_out:.0f} B, {ms(g_time)}",
        )
        report.add(
            NAME,
            "a member's page view (touch), same measure",
            f"{m_cmds:.1f} cmds (1 round trip), {m_in:.0f} B / {m_out:.0f} B, {ms(m_time)}",
        )
        report.add(NAME, "guest / member time", f"{g_time / m_time:.2f}x")
        flush(client)
    client.close()


def _timed_count(s: Any, now: float) -> float:
    started = time.perf_counter()
    s.run(s.plans.count_guests(now))
    return time.perf_counter() - started
