"""The WebSocket consumer at ``ws/presence/`` (protocol: docs/websocket.md).

A thin edge: frames are validated by :func:`presence.domain.parse_frame`, recorded through
:mod:`presence.lifecycle` (and :mod:`presence.api` for status changes), and fanned out by
the process's :class:`presence.hub.Hub`. Its modules:

- :mod:`~presence.consumers.consumer` -- :class:`PresenceConsumer`: connecting, disconnecting,
  and the face the hub and the frame handlers call, done by its parts;
- :mod:`~presence.consumers.state` -- the connection's state (subscriptions, rooms, rate,
  device, heartbeat times, flags) and :class:`~presence.consumers.state.Socket`, what its parts
  and the frame handlers use of the consumer;
- :mod:`~presence.consumers.frames` -- receiving: rate limit, parsing, the handler of the
  frame's type in the socket's frame registry (:data:`presence.frames.FRAMES`);
- :mod:`~presence.consumers.handlers` -- presence's own frames (heartbeat, subscribe, ...);
- :mod:`~presence.consumers.rooms` -- room frames, and the connection's rooms;
- :mod:`~presence.consumers.credentials` -- :class:`Credentials`, re-checking the session or
  token;
- :mod:`~presence.consumers.sending` -- :class:`Sender`, sending within the server's limits;
- :mod:`~presence.consumers.limits` -- close codes, RATE_LIMIT and the weight of frames;
- :mod:`~presence.consumers.scope` -- origin and device of the handshake;
- :mod:`~presence.consumers.tidy` -- closing stale database connections once per interval.

The names below are importable from ``presence.consumers`` as before the split. Module-level
settings (``SEND_TIMEOUT``, ``TIDY_INTERVAL``, ...) are read where they are defined: patch them
there (``presence.consumers.sending.SEND_TIMEOUT``).
"""

from __future__ import annotations

# presence.consumers.sessions has long been presence.sessions (tests reach it that way)
from presence import sessions as sessions
from presence.consumers.consumer import PresenceConsumer
from presence.consumers.limits import (
    ANSWER_BYTES_PER_FRAME,
    CLOSE_FOREIGN_ORIGIN,
    CLOSE_RATE_LIMITED,
    CLOSE_TOO_MANY_CONNECTIONS,
    CLOSE_TOO_SLOW,
    CLOSE_UNAUTHENTICATED,
    IDS_PER_FRAME,
    ROOM_MEMBERS_PER_FRAME,
    RateLimit,
    frame_cost,
    join_cost,
)
from presence.consumers.sending import (
    SEND_TIMEOUT,
    SPLIT_FRAME_BYTES,
    ClientGone,
    SendFailed,
    frame_limit,
    is_disconnect,
    server_connection,
    unsent_bytes,
)
from presence.consumers.subscribing import read_user_ids
from presence.consumers.tidy import TIDY_INTERVAL, tidy_database_connections

__all__ = [
    "ANSWER_BYTES_PER_FRAME",
    "CLOSE_FOREIGN_ORIGIN",
    "CLOSE_RATE_LIMITED",
    "CLOSE_TOO_MANY_CONNECTIONS",
    "CLOSE_TOO_SLOW",
    "CLOSE_UNAUTHENTICATED",
    "IDS_PER_FRAME",
    "ROOM_MEMBERS_PER_FRAME",
    "SEND_TIMEOUT",
    "SPLIT_FRAME_BYTES",
    "TIDY_INTERVAL",
    "ClientGone",
    "PresenceConsumer",
    "RateLimit",
    "SendFailed",
    "frame_cost",
    "frame_limit",
    "is_disconnect",
    "join_cost",
    "read_user_ids",
    "server_connection",
    "tidy_database_connections",
    "unsent_bytes",
]
