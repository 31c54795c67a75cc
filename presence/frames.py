"""The client frames of ``ws/presence/`` and their handlers: one registry for presence's own
frames, rooms' and the types installed apps add (the feed's ``watch_feed``, ...).

Presence's own types are parsed by :func:`presence.domain.parse_frame` into its messages; the
consumer registers their handlers by message class (:meth:`FrameRegistry.handles`). An app's
types come with their parser (:meth:`FrameRegistry.add`, through
:func:`presence.extensions.register_frame`, the documented face for apps). Either way a
handler is ``async handle(connection, message)``, run on the connection's consumer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from presence import domain

Parse = Callable[[Mapping[str, Any]], Any]
Handle = Callable[[Any, Any], Awaitable[None]]
HandleOwn = TypeVar("HandleOwn", bound=Callable[..., Awaitable[None]])


@dataclass(frozen=True)
class AddedFrame:
    """A frame type an installed app added: its parser and its handler."""

    parse: Parse
    handle: Handle


class FrameRegistry:
    """Frame types and their handlers: a parsed frame is handed to its type's handler."""

    def __init__(self) -> None:
        #: presence's own frames, by the class domain.parse_frame parses them into
        self.own: dict[type, Handle] = {}
        #: the types installed apps added, by the frame's ``type``
        self.added: dict[str, AddedFrame] = {}

    def handles(self, *message_types: type) -> Callable[[HandleOwn], HandleOwn]:
        """Register a function as the handler of these of presence's own messages (classes of
        :data:`presence.domain.ClientMessage`)."""

        def register(handle: HandleOwn) -> HandleOwn:
            for message_type in message_types:
                self.own[message_type] = handle
            return handle

        return register

    def add(self, type: str, parse: Parse, handle: Handle) -> None:
        """Accept client frames ``{"type": type, ...}``: ``parse`` validates, ``handle`` acts.
        Adding a type again replaces it; presence's own types cannot be replaced."""
        if not isinstance(type, str) or not type:
            raise ValueError(f"A frame type is a non-empty string, got {type!r}.")
        if type in domain.CLIENT_TYPES:
            raise ValueError(f"{type!r} is one of presence's own frame types.")
        self.added[type] = AddedFrame(parse, handle)

    def parsers(self) -> dict[str, Parse]:
        """The added types and their parsers (what domain.parse_frame takes)."""
        return {type: frame.parse for type, frame in self.added.items()}

    def parse(self, text: str | None, limits: domain.Limits) -> domain.ClientMessage:
        """One client frame as a message, or :class:`presence.domain.InvalidInput`."""
        return domain.parse_frame(text, limits, self.parsers())

    async def handle(self, connection: Any, message: domain.ClientMessage) -> None:
        """Hand a parsed frame to its type's handler."""
        if isinstance(message, domain.Extension):
            await self.added[message.type].handle(connection, message.message)
        else:
            await self.own[type(message)](connection, message)


#: the registry of ``ws/presence/``
FRAMES = FrameRegistry()
