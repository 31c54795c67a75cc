"""The admission-flood benchmark's client (``benchmarks/bench_admission_flood.py`` runs it as a
subprocess, so that its CPU is not the server's): real sockets over loopback with the
``websockets`` client.

``python -m benchmarks.admission_flood_client SPEC.json`` reads what to do from the file and
prints one JSON line of results. Each round measures the other user's first snapshot (open
``ws/presence/``, subscribe to their page, wait for ``presence_state``) twice, side by side:
idle, and with ``flood`` sockets of one account opened just before (all handshakes done, each
then left alone: no frame sent, and nothing read, so that a close from the server is not
answered either: the flooder's client costs the server as much as it can). The flood's sockets
are closed after each flood measurement, and the server is given a moment to sign them off.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

#: the longest one measurement may take (a bounded wait, also on a server that never answers)
WAIT = 60.0
#: after a flood is closed: its sign-offs reach Redis before the next round
SETTLE = 1.0


def headers(spec: dict[str, Any], cookie: str) -> dict[str, str]:
    return {"Cookie": cookie, "Origin": spec["origin"]}


async def first_snapshot(spec: dict[str, Any]) -> float:
    """Seconds from the other user's handshake to their first snapshot."""
    started = time.perf_counter()
    async with connect(spec["url"], additional_headers=headers(spec, spec["other"])) as ws:
        await ws.send(json.dumps({"type": "subscribe", "users": spec["users"]}))
        async with asyncio.timeout(WAIT):
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] == "presence_state":
                    return time.perf_counter() - started


async def open_flood(spec: dict[str, Any]) -> list[ClientConnection]:
    """``flood`` sockets of the flooder's account, opened at once; the handshakes that failed
    are left out (counted by the caller)."""

    async def one() -> ClientConnection:
        ws = await connect(spec["url"], additional_headers=headers(spec, spec["flooder"]))
        ws.transport.pause_reading()  # reads nothing more (close_all reads again)
        return ws

    opened = await asyncio.gather(*(one() for _ in range(spec["flood"])), return_exceptions=True)
    return [ws for ws in opened if isinstance(ws, ClientConnection)]


async def close_all(sockets: list[ClientConnection]) -> dict[str, int]:
    """Close the flood's sockets; how many the server had closed already, by close code."""
    for ws in sockets:
        if not ws.transport.is_closing():
            ws.transport.resume_reading()
    await asyncio.sleep(0.2)  # what the server sent meanwhile is read
    codes: dict[str, int] = {}
    for ws in sockets:
        if ws.close_code is not None:
            code = str(ws.close_code)
            codes[code] = codes.get(code, 0) + 1
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return codes


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"idle": [], "flood": [], "opened": [], "closed_by_server": []}
    for _ in range(spec["rounds"]):
        result["idle"].append(await first_snapshot(spec))
        flood = await open_flood(spec)
        try:
            result["flood"].append(await first_snapshot(spec))
        finally:
            result["opened"].append(len(flood))
            result["closed_by_server"].append(await close_all(flood))
        await asyncio.sleep(SETTLE)
    return result


if __name__ == "__main__":
    with open(sys.argv[1]) as spec_file:
        print(json.dumps(asyncio.run(main(json.load(spec_file)))))
