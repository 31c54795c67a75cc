"""Diagnosis (servers only, ``LOADTEST_TIMING_DIR``): where a status change's time goes before
its answer. For each ``set_status`` frame, from the client's stamp (the text ``t=...``): when
the consumer took the frame in, when the handler's write began and when it returned, and when
its database transaction began and ended, one line per frame in ``<dir>/<pid>.log`` (seconds
after the stamp: taken, writing, written, saving, saved)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.apps import AppConfig

from tools.loadtest.generator import stamp_of

LOG_ENV = "LOADTEST_TIMING_DIR"


class TimingConfig(AppConfig):
    name = "tools.loadtest.timing"
    label = "loadtest_timing"

    def ready(self) -> None:
        import json

        from presence import announce, api
        from presence.api import _status
        from presence.consumers import consumer

        directory = Path(os.environ[LOG_ENV])
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f"{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        taken: dict[float, float] = {}

        receive = consumer.PresenceConsumer.receive

        async def timed_receive(
            self: Any, text_data: str | None = None, bytes_data: Any = None
        ) -> None:
            if text_data and '"set_status"' in text_data:
                stamp = stamp_of(json.loads(text_data).get("text"))
                if stamp is not None:
                    taken[stamp] = time.time()
            await receive(self, text_data, bytes_data)

        consumer.PresenceConsumer.receive = timed_receive  # type: ignore[method-assign]

        save = _status._save
        saved: dict[float, tuple[float, float]] = {}

        def timed_save(user_id: Any, change: Any, *args: Any) -> None:
            began = time.time()
            try:
                save(user_id, change, *args)
            finally:
                stamp = stamp_of(change.text)
                if stamp is not None:
                    saved[stamp] = (began, time.time())

        _status._save = timed_save  # type: ignore[assignment]
        apply_change = api.aapply_change

        async def timed_apply_change(user: Any, change: Any, *args: Any, **kwargs: Any) -> Any:
            stamp = stamp_of(change.text)
            writing = time.time()
            try:
                return await apply_change(user, change, *args, **kwargs)
            finally:
                if stamp is not None:
                    at = taken.pop(stamp, writing)
                    began, ended = saved.pop(stamp, (writing, writing))
                    line = (
                        f"{at - stamp:.4f} {writing - stamp:.4f} {time.time() - stamp:.4f} "
                        f"{began - stamp:.4f} {ended - stamp:.4f}\n"
                    )
                    os.write(fd, line.encode())

        api.aapply_change = timed_apply_change

        # The awaits after a change's transaction, each timed alone (every call, not only
        # status changes'): "<name> <seconds>" lines in <dir>/<pid>.calls.log.
        calls = os.open(
            directory / f"{os.getpid()}.calls.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )

        def log(name: str, seconds: float, *details: object) -> None:
            """One "<name> <seconds> [details...]" line of <pid>.calls.log."""
            line = " ".join([name, f"{seconds:.4f}", *map(str, details)])
            os.write(calls, f"{line}\n".encode())

        def timed(module: Any, name: str) -> None:
            original = getattr(module, name)

            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                began = time.time()
                try:
                    return await original(*args, **kwargs)
                finally:
                    log(name, time.time() - began)

            setattr(module, name, wrapper)

        for name in (
            "achanged",
            "astamp_changes",
            "with_members",
            "_send_changes",
            "aannounce_room_members_changed",
        ):
            timed(announce, name)

        # The waits for a channel-layer call slot (presence.layer.layer_slot), and the live
        # plans' Redis round trips (one pipeline per event loop's moment): "slot_wait <seconds>
        # <slots taken when asked>" and "store_batch <seconds> <commands>" lines, to tell a wait
        # for the process's own limit from a wait for Redis.
        from presence import layer as layer_module
        from presence.store import client as store_client

        real_slot = layer_module.layer_slot

        class TimedSlot:
            def __init__(self) -> None:
                self.slots = real_slot()

            async def __aenter__(self) -> None:
                taken = layer_module.LAYER_CALLS_AT_ONCE - self.slots._value
                began = time.time()
                await self.slots.acquire()
                log("slot_wait", time.time() - began, taken)

            async def __aexit__(self, *exc: Any) -> None:
                self.slots.release()

        layer_module.layer_slot = TimedSlot  # type: ignore[assignment]
        announce.layer_slot = TimedSlot  # type: ignore[assignment]

        send = store_client._Batches._send

        async def timed_send(self: Any, parts: Any) -> Any:
            began = time.time()
            try:
                return await send(self, parts)
            finally:
                log("store_batch", time.time() - began, sum(len(part) for part in parts))

        store_client._Batches._send = timed_send  # type: ignore[method-assign]

        # How long a live plan waits between being asked and its batch going out
        # ("batch_queued <seconds>", the oldest of the batch), and how late the event loop runs
        # a callback made due now ("loop_lag <seconds>", sampled every 0.1 s once it runs).
        ask = store_client._Batches.ask
        first_asked: dict[int, float] = {}

        def timed_ask(self: Any, request: Any) -> Any:
            first_asked.setdefault(id(self), time.time())
            return ask(self, request)

        def timed_flush(self: Any) -> None:
            began = first_asked.pop(id(self), None)
            if began is not None:
                log("batch_queued", time.time() - began)
            flush(self)

        flush = store_client._Batches._flush
        store_client._Batches.ask = timed_ask  # type: ignore[method-assign]
        store_client._Batches._flush = timed_flush  # type: ignore[method-assign]

        def sample_lag(due: float) -> None:
            import asyncio

            log("loop_lag", time.time() - due)
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, lambda: loop.call_soon(sample_lag, time.time()))

        #: the servers' event loop, once a socket reached the hub (the sampler started then)
        main_loop: list[Any] = []

        def start_sampling() -> None:
            import asyncio

            loop = asyncio.get_running_loop()
            loop.call_soon(sample_lag, time.time())
            main_loop.append(loop)
            if os.environ.get("LOADTEST_GC_POLICY") == "python":
                # Comparison: Python's own collections, not the demo's asgi.py policy.
                from presence.collector import stop_collecting_in_short_pauses

                if stop_collecting_in_short_pauses():
                    gc.unfreeze()

        from presence.hub import Hub

        get = Hub.get.__func__  # type: ignore[attr-defined]

        def sampled_get(cls: Any) -> Any:
            if not main_loop:
                start_sampling()
            return get(cls)

        Hub.get = classmethod(sampled_get)  # type: ignore[method-assign,assignment]

        # Collections of the cyclic garbage collector ("gc <generation> <seconds> <objects
        # collected>"), and with LOADTEST_CENSUS set, once, at the 15th full collection, what the
        # collector walks, by type ("<dir>/<pid>.census"; the count itself stops the process for
        # a while); daphne's once-a-second sweep of its connections ("app_checker <seconds>
        # <connections>"): what stops the event loop for a while.
        import gc

        census_wanted = bool(os.environ.get("LOADTEST_CENSUS"))
        gc_began = 0.0
        full_collections = 0

        def census() -> None:
            from collections import Counter

            kinds = Counter(
                f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects()
            )
            lines = [f"{count} {kind}" for kind, count in kinds.most_common(60)]
            total = sum(kinds.values())
            (directory / f"{os.getpid()}.census").write_text(f"{total} all\n" + "\n".join(lines))

        def on_gc(phase: str, info: dict[str, int]) -> None:
            nonlocal gc_began, full_collections
            if phase == "start":
                gc_began = time.perf_counter()
                return
            took = time.perf_counter() - gc_began
            generation = info["generation"]
            if generation > 0 or took > 0.005:
                log("gc", took, generation, info["collected"])
            if census_wanted and generation == 2 and main_loop:
                full_collections += 1
                if full_collections == 15:
                    main_loop[0].call_soon_threadsafe(census)

        gc.callbacks.append(on_gc)

        try:
            from daphne.server import Server
        except ImportError:
            return
        checker = Server.application_checker

        def timed_checker(self: Any) -> None:
            began = time.perf_counter()
            size = len(self.connections)
            checker(self)
            log("app_checker", time.perf_counter() - began, size)

        Server.application_checker = timed_checker
