"""amplification: what one client frame costs the server, against what the client paid for it.

In this process, on the benchmark's Redis (commands counted from ``INFO commandstats`` deltas,
the counter's own INFO calls left out) and WebsocketCommunicator connections:

- one subscribe of 1,000 users (MAX_SUBSCRIPTIONS) that no other connection of the process
  watches: its frame's bytes, the Redis commands it caused (channel-layer group joins, the
  snapshot's reads) and the bytes of its answer, for users without and with custom statuses as
  long as TEXT_MAX_LENGTH allows (letters JSON escapes: the worst case);
- the matching unsubscribe of the 1,000 (group leaves);
- a connection opened and closed (the churn a reconnecting client causes);
- from these, what one connection can make the server do in one RATE_LIMIT window at the
  fastest pace the limit allows (subscribe and unsubscribe of 500 users with long statuses, in
  turn): frames, answer bytes and Redis commands per second. The rate limit's weights
  (``IDS_PER_FRAME``; ``ANSWER_BYTES_PER_FRAME`` where the consumer has it) bound this.

A client that never reads is measured by tests/load/test_slow_clients.py on a real daphne (memory
held for it, and when it is dropped), not here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from benchmarks.common import Report, Sizes, flush, raw_client, say

NAME = "amplification"
USERS = 1000
TIMEOUT = 30.0
LONG = "é" * 140


def _commands(client: Any) -> dict[str, int]:
    return {
        name.removeprefix("cmdstat_"): int(values["calls"])
        for name, values in client.info("commandstats").items()
        if name != "cmdstat_info"
    }


def _delta(client: Any, before: dict[str, int]) -> dict[str, int]:
    after = _commands(client)
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _make_users(prefix: str, count: int, viewer: Any, long_status: bool) -> list[int]:
    from presence.models import Contact, UserStatus

    model = get_user_model()
    model.objects.bulk_create([model(username=f"{prefix}{i}", password="!") for i in range(count)])
    made = model.objects.filter(username__startswith=prefix).order_by("pk")
    ids = list(made.values_list("pk", flat=True))
    if long_status:
        UserStatus.objects.bulk_create(
            [UserStatus(user_id=i, text=LONG, emoji="😀" * 16, activity=LONG) for i in ids]
        )
    Contact.objects.bulk_create([Contact(owner_id=i, contact=viewer) for i in ids])
    return ids


async def _answer(comm: WebsocketCommunicator, want: int) -> tuple[int, int]:
    """Bytes and frames of a presence_state answer covering ``want`` users."""
    got, size, frames = 0, 0, 0
    while got < want:
        output = await comm.receive_output(timeout=TIMEOUT)
        size += len(output["text"].encode())
        frames += 1
        message = json.loads(output["text"])
        got += len(message.get("presences", {}))
        if message["type"] == "error":
            raise RuntimeError(message)
    return size, frames


async def _measure(viewer: Any, plain: list[int], heavy: list[int]) -> dict[str, Any]:
    from channels.routing import URLRouter

    from presence.routing import websocket_urlpatterns

    app = URLRouter(websocket_urlpatterns)
    client = raw_client(decode=True)
    figures: dict[str, Any] = {}

    comm = WebsocketCommunicator(app, "/ws/presence/")
    comm.scope["user"] = viewer
    assert (await comm.connect(timeout=TIMEOUT))[0]
    await comm.send_json_to({"type": "subscribe", "users": []})
    await comm.receive_output(timeout=TIMEOUT)

    for label, ids in (("plain", plain), ("long", heavy)):
        frame = json.dumps({"type": "subscribe", "users": ids})
        before = _commands(client)
        await comm.send_to(text_data=frame)
        size, frames = await _answer(comm, len(ids))
        figures[f"subscribe_{label}"] = (len(frame), _delta(client, before), size, frames)
        before = _commands(client)
        await comm.send_json_to({"type": "unsubscribe", "users": ids})
        # Unsubscribe has no answer: an empty subscribe behind it tells when it is done.
        await comm.send_json_to({"type": "subscribe", "users": []})
        await comm.receive_output(timeout=TIMEOUT)
        figures[f"unsubscribe_{label}"] = _delta(client, before)

    half = heavy[: USERS // 2]
    before = _commands(client)
    await comm.send_json_to({"type": "subscribe", "users": half})
    size, _ = await _answer(comm, len(half))
    await comm.send_json_to({"type": "unsubscribe", "users": half})
    await comm.send_json_to({"type": "subscribe", "users": []})
    await comm.receive_output(timeout=TIMEOUT)
    figures["cycle_500"] = (sum(_delta(client, before).values()), size)

    # A reconnect while the process's hub runs (comm keeps it): open, first frame, close.
    before = _commands(client)
    other = WebsocketCommunicator(app, "/ws/presence/")
    other.scope["user"] = viewer
    assert (await other.connect(timeout=TIMEOUT))[0]
    await other.send_json_to({"type": "subscribe", "users": []})
    await other.receive_output(timeout=TIMEOUT)
    figures["connect"] = _delta(client, before)
    before = _commands(client)
    await other.disconnect(timeout=TIMEOUT)
    await asyncio.sleep(0.5)  # anything the close leaves to the hub
    figures["disconnect"] = _delta(client, before)
    await comm.disconnect(timeout=TIMEOUT)
    client.close()
    return figures


def run(sizes: Sizes, report: Report) -> None:
    from django.test import override_settings

    from presence import consumers
    from presence.conf import PresenceSettings

    say(f"\n== {NAME} ==")
    client = raw_client()
    flush(client)
    client.close()
    model = get_user_model()
    viewer = model.objects.create_user(username="amp-viewer", password="!")
    plain = _make_users("amp-plain", USERS, viewer, long_status=False)
    heavy = _make_users("amp-long", USERS, viewer, long_status=True)
    # Measured without a rate limit in the way; the pace below is reckoned with the default one.
    frames, seconds = PresenceSettings().RATE_LIMIT
    with override_settings(PRESENCE={"SWEEP_INTERVAL": 3600, "RATE_LIMIT": (10**6, 10)}):
        figures = asyncio.run(_measure(viewer, plain, heavy))

    def total(delta: dict[str, int]) -> int:
        return sum(delta.values())

    for label in ("plain", "long"):
        sent, delta, size, answer_frames = figures[f"subscribe_{label}"]
        groups = {k: v for k, v in delta.items() if k in ("zadd", "expire", "zrem")}
        say(
            f"  subscribe of {USERS} ({label} statuses): {sent:,} B frame -> {total(delta):,} "
            f"Redis commands ({groups}), answer {size:,} B in {answer_frames} frame(s): "
            f"{size / sent:.0f}x the bytes"
        )
        report.add(NAME, f"subscribe {USERS}, {label}: Redis commands", f"{total(delta):,}")
        report.add(NAME, f"subscribe {USERS}, {label}: answer bytes", f"{size:,}")
        unsub = figures[f"unsubscribe_{label}"]
        say(f"  unsubscribe of {USERS}: {total(unsub):,} Redis commands ({unsub})")
    connect, disconnect = figures["connect"], figures["disconnect"]
    say(
        f"  connect + first frame: {total(connect)} Redis commands ({connect}); close: "
        f"{total(disconnect)} ({disconnect}); "
        f"({total(connect) + total(disconnect)} per reconnect)"
    )
    report.add(NAME, "connect + close: Redis commands", str(total(connect) + total(disconnect)))

    # The fastest a connection may go within RATE_LIMIT: subscribe and unsubscribe 500 users
    # with long statuses, in turn.
    cycle_commands, answer = figures["cycle_500"]
    per_frame = getattr(consumers, "ANSWER_BYTES_PER_FRAME", None)
    cost = 2 * consumers.frame_cost(USERS // 2) + (answer // per_frame if per_frame else 0)
    cycles = max(1, frames // cost)  # a cycle heavier than the budget still passes alone
    say(
        f"  one connection at the allowed pace ({frames} frames / {seconds} s): {cycles} "
        f"subscribe+unsubscribe cycles of 500 per window (each {cost} frames of the budget), "
        f"{cycles * answer / seconds / 1024:,.0f} KiB/s of answers, "
        f"{cycles * cycle_commands / seconds:,.0f} Redis commands/s"
    )
    report.add(
        NAME, "one connection at the allowed pace: answers", f"{cycles * answer / seconds:,.0f} B/s"
    )
    report.add(
        NAME,
        "one connection at the allowed pace: Redis",
        f"{cycles * cycle_commands / seconds:,.0f} commands/s",
    )
