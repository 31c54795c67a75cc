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
    """A frame type an installed app added: its parser and its handler, and the field of the
    frame every error answering it repeats (``named_by``: the feed's ``"feed"``), so that a
    client tells that error from the answer of another request (errors carry no request id)."""

    parse: Parse
    handle: Handle
    named_by: str | None = None


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

    def add(self, type: str, parse: Parse, handle: Handle, named_by: str | None = None) -> None:
        """Accept client frames ``{"type": type, ...}``: ``parse`` validates, ``handle`` acts;
        every error answering such a frame repeats its field ``named_by``, where the frame gave
        it as a string. Adding a type again replaces it; presence's own types cannot be
        replaced."""
        if not isinstance(type, str) or not type:
            raise ValueError(f"A frame type is a non-empty string, got {type!r}.")
        if type in domain.CLIENT_TYPES:
            raise ValueError(f"{type!r} is one of presence's own frame types.")
        if named_by is not None and (not isinstance(named_by, str) or named_by in _ERROR_FIELDS):
            raise ValueError(f"named_by is the name of a field of the frame, got {named_by!r}.")
        self.added[type] = AddedFrame(parse, handle, named_by)

    def parsers(self) -> dict[str, Parse]:
        """The added types and their parsers (what domain.parse_frame takes)."""
        return {type: frame.parse for type, frame in self.added.items()}

    def parse(
        self, text: str | None, limits: domain.Limits, named: dict[str, str] | None = None
    ) -> domain.ClientMessage:
        """One client frame as a message, or :class:`presence.domain.InvalidInput`. ``named``
        receives, before the frame is parsed any further, what its errors name: its type (as
        ``answers``, where it is a type this site accepts) and the field an added type's
        ``named_by`` says (where the frame gives it as a string): an error of the parse itself
        names them too."""
        parsers = self.parsers()
        if named is None:
            return domain.parse_frame(text, limits, parsers)
        for type, frame in self.added.items():
            if frame.named_by is not None:
                parsers[type] = _naming(frame.parse, frame.named_by, named)

        def answering(type: str) -> None:
            named[ANSWERS] = type

        return domain.parse_frame(text, limits, parsers, typed=answering)

    async def handle(self, connection: Any, message: domain.ClientMessage) -> None:
        """Hand a parsed frame to its type's handler."""
        if isinstance(message, domain.Extension):
            await self.added[message.type].handle(connection, message.message)
        else:
            await self.own[type(message)](connection, message)


#: the field of every error answering a frame of a type the site accepts: that frame's type
#: (errors carry no request id; a client tells which of its requests an error answers by it)
ANSWERS = "answers"

#: the fields of an error frame itself, which no frame's field may stand for
_ERROR_FIELDS = frozenset({"type", "code", "message", "room", "users", "retry_after", ANSWERS})


def _naming(parse: Parse, field: str, named: dict[str, str]) -> Parse:
    def parse_naming(data: Mapping[str, Any]) -> Any:
        value = data.get(field)
        if isinstance(value, str):
            named[field] = value
        return parse(data)

    return parse_naming


#: the registry of ``ws/presence/``
FRAMES = FrameRegistry()
