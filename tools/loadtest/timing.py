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

        api.aapply_change = timed_apply_change  # type: ignore[assignment]

        # The awaits after a change's transaction, each timed alone (every call, not only
        # status changes'): "<name> <seconds>" lines in <dir>/<pid>.calls.log.
        calls = os.open(
            directory / f"{os.getpid()}.calls.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )

        def timed(module: Any, name: str) -> None:
            original = getattr(module, name)

            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                began = time.time()
                try:
                    return await original(*args, **kwargs)
                finally:
                    os.write(calls, f"{name} {time.time() - began:.4f}\n".encode())

            setattr(module, name, wrapper)

        for name in (
            "achanged",
            "astamp_changes",
            "with_members",
            "_send_changes",
            "aannounce_room_members_changed",
        ):
            timed(announce, name)
