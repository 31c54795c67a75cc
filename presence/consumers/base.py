"""The state the rooms of a connection (the mixins of
:class:`~presence.consumers.PresenceConsumer`) share: declared here, set by ``connect``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from channels.generic.websocket import AsyncWebsocketConsumer

from presence import domain
from presence.consumers.limits import RateLimit
from presence.domain import UserId

if TYPE_CHECKING:
    from presence.hub import Hub
    from presence.sessions import Credential


class ConsumerBase(AsyncWebsocketConsumer):
    """A presence WebSocket connection's state. Only ``attached`` has a value before ``connect``
    accepted an authenticated user: the rest is read after checking it."""

    #: in the hub and recorded in Redis: frames are handled, and closing it has to clean up
    attached: bool = False
    #: closed because its user was deleted: its rooms are left at once, without the grace
    account_deleted: bool = False

    user: Any
    viewer_id: UserId
    connection_id: str
    device: domain.Device
    hub: Hub
    limits: domain.Limits
    rate: RateLimit
    #: the presence last sent for each subscribed user (the hub's Connection protocol; None:
    #: what the client's page showed, left out of its snapshot as unchanged)
    sent: dict[UserId, domain.Presence | None]
    #: users whose snapshot is being read; a change meanwhile is delivered again after it
    snapshotting: set[UserId]
    #: each subscribed user's id as the client sent it: the keys of the frames it receives
    spelling: dict[UserId, int | str]
    #: the session or token the connection was opened with (presence.sessions), None when it
    #: is never re-checked (another authentication middleware)
    credential: Credential | None
    #: when the credential was last checked (time.time())
    session_checked: float
    #: the idle state last reported by the client
    idle: bool
    #: when this connection's state was last written to Redis (see heartbeat)
    written_at: float
    heartbeat_interval: float
