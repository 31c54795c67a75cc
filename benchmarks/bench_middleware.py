"""Middleware overhead: authenticated requests/s of a small page with and without presence.

Three variants are interleaved request by request (order rotated), so drift and noise hit all
alike; each round gives each variant's requests/s, and ratios are medians over rounds:

* ``without``   MIDDLEWARE minus ``presence.middleware.PresenceMiddleware``;
* ``throttled`` with the middleware, TOUCH_INTERVAL 3600 s: the steady state of a busy user,
  where the per-process throttle answers and Redis is not contacted;
* ``touching``  with the middleware, the throttle forgetting the user before every request, so
  every request pays its one Redis round trip (the worst case: a user's first request per
  interval).
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
    def __init__(self, name: str, middleware: list[str], forget_user: bool) -> None:
        self.name = name
        self.middleware = middleware
        self.forget_user = forget_user
        self.client = Client()
        self.rps: list[float] = []
        #: process CPU seconds per request: insensitive to other processes competing for CPUs
        self.cpu: list[float] = []
        self.wall_total = 0.0
        self.cpu_total = 0.0

    def login(self, user: Any) -> None:
        if self.middleware == list(settings.MIDDLEWARE):
            build: AbstractContextManager[Any] = nullcontext()
        else:
            build = override_settings(MIDDLEWARE=self.middleware)
        with build:
            self.client.force_login(user)
            # The first request builds this client's middleware chain, once, under these
            # settings; later requests reuse it without touching settings.
            for _ in range(20):
                self.request()

    def request(self) -> None:
        if self.forget_user:
            throttle.forget(USER_ID)
        start, start_cpu = time.perf_counter(), time.process_time()
        response = self.client.get(URL)
        self.wall_total += time.perf_counter() - start
        self.cpu_total += time.process_time() - start_cpu
        if response.status_code != 200:
            raise RuntimeError(f"{self.name}: GET {URL} answered {response.status_code}")

    def end_round(self, count: int) -> None:
        self.rps.append(count / self.wall_total)
        self.cpu.append(self.cpu_total / count)
        self.wall_total = self.cpu_total = 0.0

    def redis_writes_per_request(self, count: int = 20) -> float:
        before = _evalsha_calls()
        for _ in range(count):
            self.request()
        self.wall_total = self.cpu_total = 0.0
        return (_evalsha_calls() - before) / count


def run(sizes: Sizes, report: Report) -> None:
    rounds, per_round = sizes.middleware_rounds, sizes.middleware_requests
    say(
        f"\n== middleware: {rounds} rounds x {per_round} authenticated GETs per variant, "
        "the variants interleaved request by request =="
    )
    with_presence = list(settings.MIDDLEWARE)
    if PRESENCE_MIDDLEWARE not in with_presence:
        raise RuntimeError(f"{PRESENCE_MIDDLEWARE} is not in benchmarks.settings.MIDDLEWARE")
    without = [m for m in with_presence if m != PRESENCE_MIDDLEWARE]
    user = get_user_model().objects.create_user(id=USER_ID, username="bench-middleware")
    variants = [
        Variant("without", without, forget_user=False),
        Variant("throttled", with_presence, forget_user=False),
        Variant("touching", with_presence, forget_user=True),
    ]
    with override_settings(PRESENCE={"TOUCH_INTERVAL": 3600}):
        throttle.clear()
        for variant in variants:
            variant.login(user)
        for _ in range(rounds):
            gc.collect()  # start each round with no garbage left by the previous one
            for n in range(per_round):
                # Rotate the order so no variant always runs first or after a given one.
                shift = n % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    variant.request()
            for variant in variants:
                variant.end_round(per_round)
        writes = {variant.name: variant.redis_writes_per_request() for variant in variants}
        throttle.clear()

    base, throttled, touching = variants
    for variant in variants:
        say(
            f"  {variant.name:>9}: median {median(variant.rps):,.0f} req/s, "
            f"{median(variant.cpu) * 1e6:,.0f} µs CPU per request; "
            f"{writes[variant.name]:.2f} Redis writes per request"
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
