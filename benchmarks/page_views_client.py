"""The page-view benchmark's client (``benchmarks/bench_page_views.py`` runs it as a subprocess,
so that its CPU is not the server's): real sockets over loopback with the ``websockets`` client.

``python -m benchmarks.page_views_client SPEC.json`` reads what to do from the file and prints one
JSON line of results. A page view of ``ours`` opens ``ws/presence/`` with a viewer's session
cookie, subscribes to the viewer's page of users with the stamp of a page rendered a moment
before (as presence.js does with the dots' ``data-presence-since``: minted here, as the tags
would), waits for the answer, sends one heartbeat and closes; ``full`` subscribes with no stamp
(``"since": null``: a reconnect with nothing to resume from, or a page of the site's own markup:
the full snapshot); ``resume`` with the stamp of the viewer's last answer (a reconnect,
presence.js's resume; the spec's ``stamps`` to start with); ``given`` with the page's
own ``since``, each page once, in turn (the parent's check). One of ``bare`` opens the bare
consumer's route with the same cookie and waits for its one frame (the server then closes).
The subscription goes in the opening request's URL (``?users=...&since=...``), as presence.js
sends it; the spec's ``subscribe: "frame"`` sends a subscribe frame once the socket is open
instead (clients that do not subscribe in the URL). ``rate`` > 0 offers page views at that rate
(open loop, at most ``in_flight`` at once); 0 keeps ``concurrency`` page views going (closed
loop: saturation). ``keep`` answers are returned whole (the parent checks them). Mode ``hold``
opens ``resident`` sockets (tabs left open) and keeps them, heartbeating, until it is stopped.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any
from urllib.parse import urlencode

from websockets.asyncio.client import connect

HEARTBEAT = json.dumps({"type": "heartbeat", "state": "active"})


class Run:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.pages: list[dict[str, Any]] = spec["pages"]
        self.done = 0
        self.errors: dict[str, int] = {}
        self.latencies: list[float] = []
        self.kept: list[dict[str, Any]] = []
        self.in_flight = 0
        self.turned_away = 0
        #: frames received by ``ours`` page views
        self.frames = 0
        #: bytes of the frames received by ``ours`` page views
        self.bytes = 0
        #: viewer -> the stamp of its last answer (``resume`` starts from the spec's ``stamps``:
        #: the answers of a ``full`` phase, as a page's last connection had them)
        self.resume: dict[str, str] = dict(spec.get("stamps") or {})
        if spec["mode"] == "resume" and self.resume:
            # The viewers whose last connection answered: each reconnect resumes.
            self.pages = [page for page in self.pages if str(page["viewer"]) in self.resume]

    async def page_view(self, page: dict[str, Any] | None = None) -> None:
        page = page or random.choice(self.pages)
        started = time.perf_counter()
        self.in_flight += 1
        try:
            if self.spec["mode"] != "bare":
                snapshot, unchanged = await self._ours(page)
                if len(self.kept) < self.spec.get("keep", 0):
                    self.kept.append(
                        {"viewer": page["viewer"], "presences": snapshot, "unchanged": unchanged}
                    )
            else:
                await self._bare(page)
        except Exception as exc:  # counted and shown: a failed page view is no page view
            name = type(exc).__name__
            self.errors[name] = self.errors.get(name, 0) + 1
        else:
            self.done += 1
            self.latencies.append(time.perf_counter() - started)
        finally:
            self.in_flight -= 1

    def _subscribe(self, page: dict[str, Any]) -> dict[str, Any]:
        mode = self.spec["mode"]
        frame: dict[str, Any] = {"type": "subscribe", "users": page["users"]}
        if mode == "ours":
            frame["since"] = _mint(page["viewer"], time.time())
        elif mode == "resume":
            frame["since"] = self.resume.get(str(page["viewer"]))
        elif mode == "full":
            frame["since"] = None  # nothing to resume from; the answer brings a stamp
        elif mode == "given":
            frame["since"] = page["since"]
        return frame

    async def _ours(self, page: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        headers = {"Cookie": page["cookie"], "Origin": self.spec["origin"]}
        subscribe = self._subscribe(page)
        url = self.spec["url"] + "ws/presence/"
        in_url = self.spec.get("subscribe", "url") == "url"
        if in_url:
            # As presence.js opens a page's socket: the subscription in the opening request.
            url += "?" + urlencode(
                {
                    "users": ",".join(map(str, subscribe["users"])),
                    "since": subscribe["since"] or "",
                },
                safe=",",
            )
        async with connect(url, additional_headers=headers) as ws:
            if not in_url:
                await ws.send(json.dumps(subscribe))
            expected = set(map(str, page["users"]))
            presences: dict[str, Any] = {}
            unchanged: list[str] = []
            while not expected <= presences.keys() | set(unchanged):
                text = await asyncio.wait_for(ws.recv(), 30)
                frame = json.loads(text)
                self.frames += 1
                self.bytes += len(text)
                if frame["type"] == "presence_state":
                    presences.update(frame["presences"])
                    unchanged += map(str, frame.get("unchanged", ()))
                    if "stamp" in frame:
                        self.resume[str(page["viewer"])] = frame["stamp"]
                elif frame["type"] == "error" and frame.get("code") == "unknown_users":
                    expected -= set(map(str, frame["users"]))
                elif frame["type"] == "error":
                    raise RuntimeError(frame["code"])
            await ws.send(HEARTBEAT)
            return presences, unchanged

    async def _bare(self, page: dict[str, Any]) -> None:
        headers = {"Cookie": page["cookie"], "Origin": self.spec["origin"]}
        async with connect(self.spec["url"] + "ws/bare/", additional_headers=headers) as ws:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if frame.get("user") is None:
                raise RuntimeError("anonymous")

    async def closed_loop(self, until: float) -> None:
        async def worker() -> None:
            while time.perf_counter() < until:
                await self.page_view()

        await asyncio.gather(*(worker() for _ in range(self.spec["concurrency"])))

    async def open_loop(self, until: float) -> None:
        rate = self.spec["rate"]
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        n = 0
        while (now := time.perf_counter()) < until:
            due = start + n / rate
            if due > now:
                await asyncio.sleep(due - now)
            n += 1
            if self.in_flight >= self.spec["in_flight"]:
                self.turned_away += 1  # the server is behind: not offered again
                continue
            task = asyncio.ensure_future(self.page_view())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=30)

    async def hold(self) -> None:
        """Open ``resident`` sockets (other tabs, open all along) and keep them until killed."""
        pages = self.pages[: self.spec["resident"]]
        sockets = []
        for page in pages:
            headers = {"Cookie": page["cookie"], "Origin": self.spec["origin"]}
            ws = await connect(self.spec["url"] + "ws/presence/", additional_headers=headers)
            await ws.send(json.dumps({"type": "subscribe", "users": page["users"][:5]}))
            await ws.recv()
            sockets.append(ws)
        print(json.dumps({"resident": len(sockets)}), flush=True)
        while True:
            await asyncio.sleep(self.spec["heartbeat"])
            for ws in sockets:
                await ws.send(HEARTBEAT)

    async def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        until = started + self.spec["seconds"]
        if self.spec["mode"] == "given":
            for page in self.pages:
                await self.page_view(page)
        elif self.spec["rate"] > 0:
            await self.open_loop(until)
        else:
            await self.closed_loop(until)
        elapsed = time.perf_counter() - started
        latencies = sorted(self.latencies)

        def pct(p: float) -> float:
            return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else 0

        return {
            "done": self.done,
            "seconds": elapsed,
            "errors": self.errors,
            "turned_away": self.turned_away,
            "p50": pct(0.5),
            "p99": pct(0.99),
            "kept": self.kept,
            "frames": self.frames,
            "bytes": self.bytes,
            "stamps": self.resume,
        }


def _mint(viewer: int, at: float) -> str:
    """The stamp the page's tags would carry (presence.stamps), for ``ours``."""
    from presence import stamps

    return stamps.mint(viewer, at)


def main(path: str) -> None:
    with open(path) as spec_file:
        spec = json.load(spec_file)
    if spec["mode"] == "ours":
        # The stamps are signed with the site's secret and settings: the server's own.
        import os

        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.page_views_settings")
        django.setup()
    if spec["mode"] == "hold":
        asyncio.run(Run(spec).hold())
        return
    result = asyncio.run(Run(spec).run())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
