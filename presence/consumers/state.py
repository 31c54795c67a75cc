"""What one connection holds between frames (:class:`ConnectionState`), and what the parts of
its consumer (sending, credentials, frame handlers) may use of it (:class:`Socket`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from presence import domain
from presence.consumers.limits import RateLimit
from presence.domain import UserId, passed
from presence.hub import Connection, Hub, Proof


@dataclass(eq=False)
class Subscriptions:
    """The users a connection subscribed to, as the hub delivers them."""

    #: the presence last sent for each subscribed user (the hub's Connection protocol; None:
    #: what the client's page showed, left out of its snapshot as unchanged)
    sent: dict[UserId, domain.Presence | None] = field(default_factory=dict)
    #: users whose snapshot is being read; a change meanwhile is delivered again after it
    snapshotting: set[UserId] = field(default_factory=set)
    #: each subscribed user's id as the client sent it: the keys of the frames it receives
    spelling: dict[UserId, int | str] = field(default_factory=dict)
    #: the first heartbeat ``restamp_wait`` seconds after ``restamp_from`` looks at the fresh
    #: stamp (restamping); the wait is infinite while the client holds no stamp (it asked for
    #: none: docs/websocket.md). Kept as a start and a length, not a due time, so that a clock
    #: stepped back cannot stretch it (domain.passed)
    restamp_from: float = 0.0
    restamp_wait: float = math.inf
    #: the fresh stamp's claim being proven by the hub, if any
    proof: Proof | None = None

    def restamp_due(self, now: float) -> bool:
        """Whether a heartbeat at ``now`` looks at the fresh stamp (read on every heartbeat)."""
        return passed(now, self.restamp_from, self.restamp_wait)

    def restamp_in(self, since: float, seconds: float) -> None:
        """The first heartbeat ``seconds`` after ``since`` looks at the fresh stamp."""
        self.restamp_from, self.restamp_wait = since, seconds

    def forget_spellings(self, user_ids: list[UserId]) -> None:
        for uid in user_ids:
            if uid not in self.sent:
                self.spelling.pop(uid, None)


@dataclass(eq=False)
class ConnectionState:
    """A connection's state, made by ``connect`` once it accepted an authenticated user (the
    rooms it is in are the hub's registry's: presence.rooms.live.ConnectionRooms)."""

    device: domain.Device
    limits: domain.Limits
    rate: RateLimit
    heartbeat_interval: float
    #: when the credential was last checked (time.time())
    session_checked: float
    #: the idle state last reported by the client
    idle: bool = False
    #: when this connection's state was last written to Redis (see the heartbeat handler)
    written_at: float = 0.0
    #: closed because its user was deleted: its rooms are left at once, without the grace
    account_deleted: bool = False
    subscriptions: Subscriptions = field(default_factory=Subscriptions)


class Socket(Connection, Protocol):
    """What the parts of a connection and the frame handlers use of its consumer
    (:class:`presence.consumers.PresenceConsumer` is the one): the hub's
    :class:`~presence.hub.Connection`, and more."""

    #: in the hub and recorded in Redis: frames are handled, and closing it has to clean up
    attached: bool
    connection_id: str
    hub: Hub
    state: ConnectionState
    #: the ASGI send of the server (channels' consumer sets it)
    base_send: Any

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None: ...

    async def disconnect(self, code: int) -> None: ...

    async def send_error(self, code: str, message: str, **extra: Any) -> None: ...

    def snapshot_sent(self) -> None:
        """A snapshot or a room_state went out: the next socket waiting may open
        (presence.admission)."""
