"""Sizes and the compressed timing of a load test run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tools.loadtest import rooms

#: presence's timing, compressed so that a run of seconds sees many heartbeats, TTLs and graces
HEARTBEAT_INTERVAL = 2
CONNECTION_TTL = 6
OFFLINE_GRACE = 2
ONLINE_WINDOW = 6
COALESCE_WINDOW = 0.2
SWEEP_INTERVAL = 0.5

#: how long any view may take to agree with the oracle after a change or a fault
CONVERGENCE_BOUND = CONNECTION_TTL + OFFLINE_GRACE + 4


def set_heartbeat(seconds: int) -> None:
    """A slower pace for big runs on small machines: the TTL stays three heartbeats."""
    global HEARTBEAT_INTERVAL, CONNECTION_TTL, CONVERGENCE_BOUND
    HEARTBEAT_INTERVAL = seconds
    CONNECTION_TTL = 3 * seconds
    CONVERGENCE_BOUND = CONNECTION_TTL + OFFLINE_GRACE + 4


def presence_settings() -> dict[str, Any]:
    """``PRESENCE`` of the servers and the harness (JSON-able)."""
    return {
        "HEARTBEAT_INTERVAL": HEARTBEAT_INTERVAL,
        "CONNECTION_TTL": CONNECTION_TTL,
        "OFFLINE_GRACE": OFFLINE_GRACE,
        "ONLINE_WINDOW": ONLINE_WINDOW,
        "TOUCH_INTERVAL": 1,
        "COALESCE_WINDOW": COALESCE_WINDOW,
        "SWEEP_INTERVAL": SWEEP_INTERVAL,
        # The default pace: heartbeats are compressed, sessions do not expire any faster.
        "SESSION_CHECK_INTERVAL": 30,
        "MAX_SUBSCRIPTIONS": 1000,
        # The generator beats every 2 s and changes status now and then: far below this.
        "RATE_LIMIT": [600, 10],
        "HTTP_RATE_LIMIT": None,
        **rooms.SETTINGS,  # some connections are in rooms (tools/loadtest/rooms.py)
    }


@dataclass(frozen=True)
class Sizes:
    users: int
    connections: int
    processes: int
    generators: int
    seconds: float
    #: ids on one connection's page (its subscriptions)
    page: int
    #: median contacts of a user (power law), and the few with the most
    median_contacts: int
    max_contacts: int
    hubs: int
    #: a few % of connections reload or close per second
    churn_per_second: float
    #: status changes, idle switches and HTTP page views per connection per second
    status_per_second: float
    idle_per_second: float
    page_views_per_second: float
    #: follows/unfollows, blocks and privacy changes the harness makes per second
    relations_per_second: float
    #: connections compared with the oracle at a checkpoint (all of them at the end)
    checkpoint_sample: int

    @classmethod
    def for_mode(cls, quick: bool) -> Sizes:
        if quick:
            return cls(
                users=2_000,
                connections=500,
                processes=2,
                generators=1,
                seconds=15,
                page=40,
                median_contacts=150,
                max_contacts=1_000,
                hubs=2,
                churn_per_second=0.03,
                status_per_second=0.02,
                idle_per_second=0.02,
                page_views_per_second=0.02,
                relations_per_second=5,
                checkpoint_sample=500,
            )
        return cls(
            users=20_000,
            connections=10_000,
            processes=3,
            generators=2,
            seconds=60,
            page=50,
            median_contacts=150,
            max_contacts=5_000,
            hubs=3,
            churn_per_second=0.02,
            status_per_second=0.005,
            idle_per_second=0.005,
            page_views_per_second=0.005,
            relations_per_second=10,
            # A sample at checkpoints (each view is read again through bulk_presence, at the
            # servers' expense on a small machine); every view at the final check.
            checkpoint_sample=500,
        )

    def replace(self, **changes: Any) -> Sizes:
        values = asdict(self)
        values.update({key: value for key, value in changes.items() if value is not None})
        return Sizes(**values)
