"""presence.metrics: every metric defined once, in prometheus_client's default registry (what
django-prometheus exports), documented in docs/operations.md; no-ops without prometheus_client;
moved by real heartbeats, diffs and Redis outages (real Redis, the channels_redis layer)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client, override_settings
from django.urls import include, path
from prometheus_client import REGISTRY

from presence import api, metrics, monitoring, signals
from tests.live.sockets import (
    Sockets,
    eventually,
    heartbeat,
    lets_see,
    new_user,
    receive,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tools.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]

urlpatterns = [
    path("presence/", include("presence.urls")),
    path("metrics", monitoring.metrics_view),
]


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def recording() -> Iterator[None]:
    """Metrics on (the default with prometheus_client installed), and on again afterwards."""
    metrics.switch(True)
    yield
    metrics.switch(True)


def _presence_metric_names() -> set[str]:
    return {m.name for m in REGISTRY.collect() if m.name.startswith("presence_")}


# --- definitions --------------------------------------------------------------------------------


def test_every_metric_is_in_the_default_registry_and_documented(recording: None) -> None:
    metrics.count_online_with(lambda: 3)
    try:
        # What Prometheus shows: counters with their _total.
        shown = {
            metric.name + "_total" if metric.type == "counter" else metric.name
            for metric in REGISTRY.collect()
            if metric.name.startswith("presence_")
        }
    finally:
        monitoring.connect()  # back to the site's source
    page = (ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(presence_[a-z_]+)`", page, re.M))
    assert len(shown) == 15
    assert shown == documented


def test_a_help_text_names_only_label_values_the_docs_name(recording: None) -> None:
    """A HELP line naming label values ('redis') names values presence produces: those
    docs/operations.md lists for the metric (a value it never produces would be a series a
    dashboard waits for in vain)."""
    page = (ROOT / "docs" / "operations.md").read_text()
    rows = {name: row for name, row in re.findall(r"^\| `(presence_[a-z_]+)`(.*)$", page, re.M)}
    # A scrape's HELP line is the metric's documentation (a counter's name shown with _total).
    helps = [
        (metric.name + "_total" if metric.type == "counter" else metric.name, metric.documentation)
        for metric in REGISTRY.collect()
        if metric.name.startswith("presence_")
    ]
    assert helps
    for name, help_text in helps:
        for label_value in re.findall(r"(?<![A-Za-z])'([a-z_]+)'", help_text):
            assert f"`{label_value}`" in rows[name] or f'"{label_value}"' in rows[name], (
                name,
                label_value,
            )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections", "recording")
async def test_frames_refused_before_they_had_a_type_are_not_counted_as_received(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """As operations.md says: no series of received frames for them, their error answers
    counted as sent."""
    socket = await sockets.open(await new_user(make_user))
    metrics.flush()
    received, errors = frames_received(), value("presence_frames_sent_total", type="error")
    for text in ["not json", json.dumps({"type": "nope"}), json.dumps([1])]:
        await socket.send_to(text_data=text)
        assert (await receive(socket))["type"] == "error"
    metrics.flush()
    assert frames_received() == received
    assert value("presence_frames_sent_total", type="error") == errors + 3


def frames_received() -> dict[str, float]:
    """Frames received, by type: every series of the counter."""
    return {
        sample.labels["type"]: sample.value
        for metric in REGISTRY.collect()
        if metric.name == "presence_frames_received"
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def test_users_online_is_read_from_the_count_at_each_scrape(recording: None) -> None:
    counts = iter([5, 8])
    metrics.count_online_with(lambda: next(counts))
    try:
        assert value("presence_users_online") == 5
        assert value("presence_users_online") == 8
        # A count that fails (Redis down) leaves the sample out rather than failing the scrape.
        metrics.count_online_with(lambda: 1 // 0)
        assert "presence_users_online" not in _presence_metric_names()
    finally:
        monitoring.connect()


def test_the_site_count_is_api_online_count_once_it_exists() -> None:
    expected = getattr(api, "online_count", None)
    assert metrics.ONLINE_COUNT.count is expected


@pytest.mark.skipif(not hasattr(signals, "user_online"), reason="presence.signals.user_online")
def test_signals_sent_are_counted(recording: None) -> None:
    before = value("presence_signals_sent_total", signal="user_online")
    signals.user_online.send(sender=None, user_id=1, at=None, invisible=False)
    assert value("presence_signals_sent_total", signal="user_online") == before + 1


def test_switched_off_the_hooks_record_nothing(recording: None) -> None:
    before = value("presence_frames_sent_total", type="presence_diff")
    metrics.switch(False)
    metrics.frame_sent("presence_diff")
    metrics.COALESCED.inc()
    assert value("presence_frames_sent_total", type="presence_diff") == before
    metrics.switch(True)
    metrics.frame_sent("presence_diff")
    assert value("presence_frames_sent_total", type="presence_diff") == before + 1


def test_without_prometheus_client_every_metric_is_a_no_op() -> None:
    # A fresh interpreter where prometheus_client cannot be imported.
    script = """
import sys
sys.modules["prometheus_client"] = None
from presence import metrics
assert not metrics.AVAILABLE and not metrics.enabled()
metrics.switch(True)
assert not metrics.enabled()
metrics.CONNECTIONS.inc(); metrics.WATCHED_USERS.dec(3); metrics.HUB_LAG.set(1.5)
metrics.REDIS_SECONDS.labels("redis").observe(0.1)
metrics.frame_received(object()); metrics.frame_sent("presence_diff")
metrics.delivered([1.0], 2.0, 0.2); metrics.redis_round_trip("redis", 0.001)
metrics.redis_outage("redis"); metrics.redis_answered("redis"); metrics.signal_sent("user_online")
metrics.count_online_with(lambda: 1)
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


# --- the view -----------------------------------------------------------------------------------


@override_settings(ROOT_URLCONF=__name__)
def test_the_view_serves_the_text_format(client: Client, db: Any, recording: None) -> None:
    metrics.frame_sent("presence_state")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'presence_frames_sent_total{type="presence_state"}' in text
    assert "# TYPE presence_fanout_latency_seconds histogram" in text


@override_settings(ROOT_URLCONF=__name__)
def test_the_view_without_prometheus_client_answers_501_in_json(
    client: Client, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "AVAILABLE", False)
    response = client.get("/metrics", HTTP_ACCEPT_LANGUAGE="ja")
    assert response.status_code == 501
    assert response.json()["error"] == {
        "code": "metrics_unavailable",
        "message": "django-live-presence[metrics] (prometheus_client) をインストールしてください。",
    }


def test_multiprocess_mode_merges_the_processes_of_a_host(
    client: Client, db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two worker processes write their values to PROMETHEUS_MULTIPROC_DIR; the view merges them.
    worker = (
        "import sys\n"
        "from presence import metrics\n"
        "metrics.CONNECTIONS.inc(int(sys.argv[1]))\n"
        "metrics.frame_sent('presence_diff')\n"
    )
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    pids = []
    for connections in (3, 5):
        done = subprocess.Popen([sys.executable, "-c", worker, str(connections)], cwd=ROOT, env=env)
        assert done.wait(timeout=60) == 0
        pids.append(done.pid)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with override_settings(ROOT_URLCONF=__name__):
        text = client.get("/metrics").content.decode()
    # Counters summed; the per-process gauges kept per process (liveall).
    assert 'presence_frames_sent_total{type="presence_diff"} 2.0' in text
    for pid, connections in zip(pids, (3, 5), strict=True):
        assert f'presence_connections{{pid="{pid}"}} {connections}.0' in text


# --- moved by the real thing --------------------------------------------------------------------


def round_trips() -> float:
    """Pipelines sent to presence's Redis, over every node (one Redis, or the masters)."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "presence_redis_round_trips"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


@pytest.mark.cluster
@pytest.mark.pubsub_layer
@pytest.mark.uuid_site
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections", "recording")
async def test_a_heartbeat_and_a_diff_move_the_counters(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    before = {
        "connections": value("presence_connections"),
        "watched": value("presence_watched_users"),
        "heartbeats": value("presence_frames_received_total", type="heartbeat"),
        "diffs": value("presence_frames_sent_total", type="presence_diff"),
        "fanout": value("presence_fanout_latency_seconds_count"),
        "deliveries": value("presence_deliveries_total"),
        "round trips": round_trips(),
        "online signals": value("presence_signals_sent_total", signal="user_online"),
    }

    watcher = await sockets.open(viewer)
    await subscribe(watcher, target)
    await heartbeat(watcher)
    metrics.flush()  # frames reach their counters once a second; now, for the test
    assert value("presence_frames_received_total", type="heartbeat") == before["heartbeats"] + 1
    assert round_trips() > before["round trips"]
    tab = await sockets.open(target)
    assert (await receive(watcher))["type"] == "presence_diff"
    metrics.flush()

    assert value("presence_connections") == before["connections"] + 2
    assert value("presence_watched_users") == before["watched"] + 1
    assert value("presence_frames_sent_total", type="presence_diff") == before["diffs"] + 1
    # (recorded once the delivery's round ends, a moment after its diff went out)
    assert await eventually(lambda: value("presence_deliveries_total") > before["deliveries"])
    assert value("presence_fanout_latency_seconds_count") >= before["fanout"] + 1
    # Counted from the change's start: at least most of the coalescing window (0.05 s here).
    assert value("presence_fanout_latency_seconds_sum") > 0
    # Both came online: a transition each, a signal each; the site's count read at the scrape.
    await sync_to_async(signals.wait_sent)()
    online_signals = value("presence_signals_sent_total", signal="user_online")
    assert online_signals == before["online signals"] + 2
    assert value("presence_users_online") == 2

    await sockets.close(tab)
    await sockets.close(watcher)
    assert value("presence_connections") == before["connections"]
    assert value("presence_watched_users") == before["watched"]


@pytest.mark.usefixtures("recording")
def test_an_outage_of_presence_redis_is_counted_once_and_its_end_seen(
    private_redis: RedisServer, make_user: Callable[..., Any], clock: Any
) -> None:
    user = make_user()
    api.touch(user)
    outages = value("presence_redis_outages_total", node="redis")
    assert value("presence_redis_up", node="redis") == 1
    private_redis.stop()
    api.touch(user)
    clock.shift(10)  # past RETRY_INTERVAL: Redis is tried again, and fails again
    api.get_presence(user, user)
    assert value("presence_redis_outages_total", node="redis") == outages + 1
    assert value("presence_redis_up", node="redis") == 0
    private_redis.start()
    clock.shift(10)
    api.get_presence(user, user)
    assert value("presence_redis_up", node="redis") == 1
    assert value("presence_redis_outages_total", node="redis") == outages + 1


async def test_frame_counts_reach_their_counter_within_a_second_by_themselves(
    recording: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Frames are counted in a plain dict and added to the counter by a callback on the loop.
    monkeypatch.setattr(metrics, "FLUSH_SECONDS", 0.01)
    before = value("presence_frames_sent_total", type="room_diff")
    metrics.frame_sent("room_diff")
    metrics.frame_sent("room_diff")
    assert value("presence_frames_sent_total", type="room_diff") == before
    await asyncio.sleep(0.05)
    assert value("presence_frames_sent_total", type="room_diff") == before + 2


def test_frames_are_labelled_by_their_type_on_the_wire() -> None:
    # The label is derived from the parsed frame's class: each must give its protocol name.
    from presence.domain import protocol

    parsed = {
        metrics._frame_name(cls)
        for cls in vars(protocol).values()
        if isinstance(cls, type)
        and cls.__module__ == protocol.__name__
        and cls.__name__
        in {
            "Heartbeat",
            "Subscribe",
            "Unsubscribe",
            "SetStatus",
            "Join",
            "Leave",
            "RoomMore",
            "WatchCount",
            "UnwatchCount",
            "WatchRoomCount",
            "UnwatchRoomCount",
        }
    }
    assert parsed == set(protocol.CLIENT_TYPES)
