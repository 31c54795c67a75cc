"""Extension points of presence's WebSocket for other installed apps (docs/extending.md):
extra client frame types (in the one registry of the socket's frames, presence.frames), and
hub "topics" with deliveries across processes.

Register from your ``AppConfig.ready()``::

    from presence import extensions

    extensions.register_frame("typing", parse_typing, handle_typing)
    extensions.register_delivery("typing", deliver_typing)

- ``parse(data)`` gets the frame's JSON object and returns a message (anything), or raises
  :class:`presence.domain.InvalidInput` (answered as an ``error`` frame; the connection stays).
- ``async handle(connection, message)`` runs on the connection's consumer: ``connection.user``,
  ``connection.viewer_id``, ``connection.send_json(...)``, ``connection.hub``; it may raise
  InvalidInput too.
- ``connection.hub.join_topic(connection, kind, key)`` / ``leave_topic`` /
  ``topics_of(connection, kind)`` / ``topic_members(kind)``: while any connection of a process
  has a topic of ``kind``, that process receives what :func:`announce_to_topic` sends for
  ``kind``, and ``async deliver(hub, payload)`` of :func:`register_delivery` handles it there.
  Topics are dropped when their connection closes.
- ``await connection.hub.send_in_order(connections, send, what)``: a delivery's sends to many
  connections, ``await send(connection)`` each in the hub's one queue per connection (after
  that connection's frames asked before; a client that reads nothing holds up no other).

And one outside the socket: :func:`register_export` adds an app's part of a user's data to
``manage.py presence_export`` (the feed's ``"feed"``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from presence import announce
from presence.frames import FRAMES, Handle, Parse

__all__ = [
    "aannounce_to_topic",
    "announce_to_topic",
    "delivery",
    "export_parts",
    "frame_handler",
    "frame_parsers",
    "register_delivery",
    "register_export",
    "register_frame",
]


class Topics(Protocol):
    """What a delivery may ask of the process's hub (``presence.hub.Hub`` is one)."""

    async def join_topic(self, connection: Any, kind: str, key: str) -> None: ...

    async def leave_topic(self, connection: Any, kind: str, key: str) -> None: ...

    def topics_of(self, connection: Any, kind: str) -> set[str]: ...

    def topic_members(self, kind: str) -> dict[Any, set[str]]: ...

    async def send_in_order(
        self, connections: Iterable[Any], send: Callable[[Any], Awaitable[None]], what: str
    ) -> None: ...


Deliver = Callable[[Topics, Any], Awaitable[None]]
#: an app's part of a user's data: ``export(user) -> JSON-ready value`` (sync, may query)
Export = Callable[[Any], Any]

#: topic kinds become part of channel-layer group names, which allow only these characters
TOPIC_KIND = re.compile(r"[a-zA-Z0-9_.-]{1,40}")


#: the frame types apps added, in the one registry of ws/presence/ (presence.frames)
_frames = FRAMES.added
_deliveries: dict[str, Deliver] = {}
_exports: dict[str, Export] = {}
#: the keys of presence's own export (api.export_user_data), which no app's part may take
_CORE_EXPORT_KEYS = frozenset(
    {"user", "privacy", "exceptions", "contacts", "blocks", "last_seen", "status", "rooms", "redis"}
)


def register_frame(type: str, parse: Parse, handle: Handle, *, named_by: str | None = None) -> None:
    """Accept client frames ``{"type": type, ...}``: ``parse`` validates, ``handle`` acts.
    ``named_by``: a field of the frame (``"feed"``) that every error answering it repeats,
    where the frame gave it as a string, as errors answering a room's frame name the room: a
    client tells them from the answer of its other requests (errors carry no request id).
    Registering a type again replaces it; presence's own types cannot be replaced."""
    FRAMES.add(type, parse, handle, named_by)


def frame_parsers() -> dict[str, Parse]:
    """The registered frame types and their parsers (what domain.parse_frame takes)."""
    return FRAMES.parsers()


def frame_handler(type: str) -> Handle:
    return FRAMES.added[type].handle


def register_delivery(kind: str, deliver: Deliver) -> None:
    """Handle what :func:`announce_to_topic` sends for ``kind`` in each process that has
    connections with a topic of ``kind``: ``await deliver(hub, payload)``."""
    if not isinstance(kind, str) or not TOPIC_KIND.fullmatch(kind):
        raise ValueError(f"A topic kind is 1-40 of a-z A-Z 0-9 _ . -, got {kind!r}.")
    _deliveries[kind] = deliver


def delivery(kind: str) -> Deliver | None:
    return _deliveries.get(kind)


async def aannounce_to_topic(kind: str, payload: Any, *, retry: bool = False) -> None:
    """Send ``payload`` (JSON-serialisable) to every process with topics of ``kind``. Never
    raises: a live update that cannot be sent is logged, and dropped; with ``retry``, sent
    again after RETRY_INTERVAL, doubling, five times (for a payload still worth delivering
    late; it may then arrive twice: the delivery must take a repeat for nothing new)."""
    await announce.aannounce_to_topic(kind, payload, retry=retry)


def announce_to_topic(kind: str, payload: Any, *, retry: bool = False) -> None:
    """:func:`aannounce_to_topic` for sync code (views, signal receivers)."""
    announce.announce_to_topic(kind, payload, retry=retry)


def register_export(key: str, export: Export) -> None:
    """Add ``export(user)`` (JSON-ready, for a data request) to ``manage.py presence_export``
    under ``key``, next to presence's own keys (which ``key`` may not be). Registering a key
    again replaces it."""
    if not isinstance(key, str) or not key or key in _CORE_EXPORT_KEYS:
        raise ValueError(f"An export's key is a string other than presence's own, got {key!r}.")
    _exports[key] = export


def export_parts() -> dict[str, Export]:
    """The registered parts of a user's data, by key (a copy)."""
    return dict(_exports)
