"""Middleware overhead: authenticated requests/s of a small page with and without presence.

Three variants run in alternating order within each round, so drift and noise hit all alike:

* ``without``   MIDDLEWARE minus ``presence.middleware.PresenceMiddleware``;
* ``throttled`` with the middleware, TOUCH_INTERVAL 3600 s: the steady state of a busy user,
  where the per-process throttle answers and Redis is not contacted;
* ``touching``  with the middleware and the throttle cleared before every request, so every
  request pays its one Redis round trip (the worst case: a user's first request per interval).
"""

from __future__ import annotations

import gc
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from benchmarks.common import Report, Sizes, median, raw_client, say
from presence.middleware import throttle

NAME = "middleware"
URL = "/page/"
USER_ID = 3_000_001  # outside the id ranges of the other benchmarks
PRESENCE_MIDDLEWARE = "presence.middleware.PresenceMiddleware"


def _evalsha_calls() -> int:
    client = raw_client()
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


class Variant:
    def __init__(self, name: str, middleware: list[str], clear_throttle: bool) -> None:
        self.name = name
        self.middleware = middleware
        self.clear_throttle = clear_throttle
        self.client = Client()
        self.rps: list[float] = []
        #: process CPU seconds per request: insensitive to other processes competing for CPUs
        self.cpu: list[float] = []
        self.redis_writes = 0
        self.requests = 0

    def settings(self) -> AbstractContextManager[Any]:
        if self.middleware == list(settings.MIDDLEWARE):
            return nullcontext()
        return override_settings(MIDDLEWARE=self.middleware)

    def login(self, user: Any) -> None:
        with self.settings():
            self.client.force_login(user)
            # The first request builds this client's middleware chain under these settings.
            self.requests_of(50)

    def requests_of(self, count: int) -> tuple[float, float]:
        client, clear = self.client, self.clear_throttle
        gc.collect()  # a collection triggered by another variant's garbage must not land here
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            if clear:
                throttle.clear()
            response = client.get(URL)
            if response.status_code != 200:
                raise RuntimeError(f"{self.name}: GET {URL} answered {response.status_code}")
        return time.perf_counter() - start, time.process_time() - start_cpu

    def round(self, count: int) -> None:
        before = _evalsha_calls()
        with self.settings():
            elapsed, cpu = self.requests_of(count)
        self.redis_writes += _evalsha_calls() - before
        self.requests += count
        self.rps.append(count / elapsed)
        self.cpu.append(cpu / count)


def run(sizes: Sizes, report: Report) -> None:
    say(
        f"\n== middleware: {sizes.middleware_rounds} rounds x {sizes.middleware_requests} "
        "authenticated GETs per variant, alternating =="
    )
    with_presence = list(settings.MIDDLEWARE)
    if PRESENCE_MIDDLEWARE not in with_presence:
        raise RuntimeError(f"{PRESENCE_MIDDLEWARE} is not in benchmarks.settings.MIDDLEWARE")
    without = [m for m in with_presence if m != PRESENCE_MIDDLEWARE]
    user = get_user_model().objects.create_user(id=USER_ID, username="bench-middleware")
    variants = [
        Variant("without", without, clear_throttle=False),
        Variant("throttled", with_presence, clear_throttle=False),
        Variant("touching", with_presence, clear_throttle=True),
    ]
    with override_settings(PRESENCE={"TOUCH_INTERVAL": 3600}):
        throttle.clear()
        for variant in variants:
            variant.login(user)
        for n in range(sizes.middleware_rounds):
            # Rotate the order so no variant always runs first (warm caches) or last.
            shift = n % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                variant.round(sizes.middleware_requests)
        throttle.clear()

    base, throttled, touching = variants
    for variant in variants:
        say(
            f"  {variant.name:>9}: median {median(variant.rps):,.0f} req/s, "
            f"{median(variant.cpu) * 1e6:,.0f} µs CPU per request; "
            f"Redis writes {variant.redis_writes} for {variant.requests} requests"
        )
    ratio = median(t / b for t, b in zip(throttled.rps, base.rps, strict=True))
    ratio_cpu = median(b / t for t, b in zip(throttled.cpu, base.cpu, strict=True))
    ratio_touch = median(t / b for t, b in zip(touching.rps, base.rps, strict=True))
    added = median(1 / t - 1 / b for t, b in zip(touching.rps, base.rps, strict=True))
    report.add(NAME, "req/s without middleware (median)", f"{median(base.rps):,.0f}")
    report.add(
        NAME,
        "with/without, throttled (median of rounds)",
        f"{ratio:.3f} (CPU time: {ratio_cpu:.3f})",
        "≥ 0.97",
        ratio >= 0.97,
    )
    report.add(
        NAME,
        "with/without, every request touches Redis",
        f"{ratio_touch:.3f} (+{added * 1e6:,.0f} µs per touching request)",
    )
