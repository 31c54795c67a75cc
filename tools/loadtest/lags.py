"""How far behind each server's hub runs during the load: its /presence/api/health "lag" (the
age of the latest announcement it took in), read every SAMPLE_EVERY seconds in a thread of the
harness. Beside the generators' own event-loop lateness it tells where a fan-out latency was
spent: in the servers, or in the clients that measured it."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

#: seconds between two reads of every server
SAMPLE_EVERY = 1.0
#: a read's bound (a saturated server answers late; the sample is then skipped)
READ_TIMEOUT = 2.0


class HubLags:
    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        #: (time, seconds behind) of every server's answers
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hub-lags", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(READ_TIMEOUT * len(self.ports) + SAMPLE_EVERY)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            for port in self.ports:
                lag = self._read(port)
                if lag is not None:
                    self.samples.append((time.time(), lag))

    @staticmethod
    def _read(port: int) -> float | None:
        url = f"http://127.0.0.1:{port}/presence/api/health"
        try:
            with urllib.request.urlopen(url, timeout=READ_TIMEOUT) as response:
                lag = json.load(response).get("lag")
        except (OSError, ValueError):
            return None  # down (a fault) or late: no sample
        return float(lag) if isinstance(lag, (int, float)) else None
