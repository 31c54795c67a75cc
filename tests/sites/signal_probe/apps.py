from __future__ import annotations

import json
import os
from typing import Any

import redis
from django.apps import AppConfig

#: the Redis list the receivers push onto (tests.settings.daphne installs this app when set)
LIST_ENV = "PRESENCE_TEST_SIGNAL_LIST"


class SignalProbeConfig(AppConfig):
    name = "tests.sites.signal_probe"
    label = "signal_probe"

    def ready(self) -> None:
        from presence import signals

        client = redis.Redis.from_url(os.environ["REDIS_URL"])
        key = os.environ[LIST_ENV]

        def record(kind: str) -> Any:
            def receiver(sender: Any, user_id: Any, at: Any, **kw: Any) -> None:
                entry = {
                    "kind": kind,
                    "user": str(user_id),
                    "at": at.timestamp(),
                    "invisible": kw.get("invisible", False),
                    "room": kw.get("room"),
                    "pid": os.getpid(),
                }
                client.rpush(key, json.dumps(entry))

            return receiver

        # held: signals keep weak refs
        self.receivers = [record(kind) for kind in ("online", "offline", "entered", "left")]
        signals.user_online.connect(self.receivers[0])
        signals.user_offline.connect(self.receivers[1])
        signals.room_entered.connect(self.receivers[2])
        signals.room_left.connect(self.receivers[3])
