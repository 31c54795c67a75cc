"""Client frames: rate-limited, parsed (:func:`presence.domain.parse_frame`) and handed to the
method that handles their type. Rooms of the consumer add frame types by marking methods with
:func:`handles`; the types installed apps add go to their handlers (presence.extensions)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from django.utils.translation import gettext

from presence import announce, domain, extensions, metrics
from presence.conf import get_settings
from presence.consumers.limits import (
    ANSWER_BYTES_PER_FRAME,
    CLOSE_RATE_LIMITED,
    answer_bytes,
)
from presence.consumers.sending import ClientGone, SendFailed, Sending

logger = logging.getLogger("presence")

Method = TypeVar("Method", bound=Callable[..., Any])

#: the attribute :func:`handles` marks a method with
_HANDLES = "_presence_handles"

#: heartbeat frames as clients spell them (presence.js' JSON.stringify, Python's json.dumps),
#: parsed once: most frames a process handles are these, and most change nothing
_HEARTBEATS: dict[str, domain.Heartbeat] = {
    text: domain.Heartbeat(state)
    for state in domain.HeartbeatState
    for text in (
        f'{{"type":"heartbeat","state":"{state.value}"}}',
        f'{{"type": "heartbeat", "state": "{state.value}"}}',
    )
}


def handles(*frame_types: type) -> Callable[[Method], Method]:
    """Mark an ``async`` method of a consumer room as the handler of these parsed frame types
    (classes of :data:`presence.domain.ClientMessage`); it gets the parsed message."""

    def mark(method: Method) -> Method:
        setattr(method, _HANDLES, frame_types)
        return method

    return mark


class FrameDispatch(Sending):
    """``receive``: a frame within RATE_LIMIT is parsed and answered; its failures are told to
    the client, and the connection goes on."""

    #: parsed frame type -> name of the method handling it, collected from the methods marked
    #: with @handles along the class's MRO (by name, so that an override handles it)
    frame_handlers: ClassVar[dict[type, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[type, str] = {}
        for klass in reversed(cls.__mro__):
            for name, attribute in vars(klass).items():
                for frame_type in getattr(attribute, _HANDLES, ()):
                    found[frame_type] = name
        cls.frame_handlers = found

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self.attached:
            return
        arrived = time.time()
        if not self.rate.allow(arrived):
            await self.rate_limited()
            return
        answered = [0]
        counting = answer_bytes.set(answered)
        try:
            # What this frame changes is announced as made when it arrived (coalescing windows
            # count from then: see Hub.changed).
            with announce.change_started_at(arrived):
                await self._answer(text_data)
        except ClientGone:
            # Its websocket.disconnect is queued behind this frame, and will clean up.
            logger.debug("Presence: user %s left while a frame was answered", self.viewer_id)
        except SendFailed:
            pass  # logged where it failed; even the error frame telling the client was refused
        finally:
            answer_bytes.reset(counting)
        # A small frame may ask for a large answer (a snapshot): its bytes weigh too.
        extra = answered[0] // ANSWER_BYTES_PER_FRAME
        if extra and self.attached:
            self.rate.charge(time.time(), extra)

    def beat_quietly(self, text_data: str | None) -> bool:
        """Handle ``text_data`` on arrival if it is a heartbeat that changes nothing (True):
        without a parse or a handler's coroutines, it writes, answers and announces nothing,
        as the heartbeat handler would. Other frames are left to ``receive`` (False)."""
        beat = _HEARTBEATS.get(text_data) if text_data is not None else None
        if beat is None or not self.attached:
            return False
        arrived = time.time()
        if not self._beats_quietly(beat, arrived) or not self.rate.allow(arrived):
            return False  # the handler's to write, or receive's to close past RATE_LIMIT
        metrics.frame_received(beat)
        return True

    def _beats_quietly(self, beat: domain.Heartbeat, now: float) -> bool:
        """Whether the heartbeat handler would do nothing with ``beat``: its idle state is the
        one written, its last write is within half a HEARTBEAT_INTERVAL (the connection is
        recorded alive for CONNECTION_TTL anyway), and no session check is due."""
        return (
            (beat.state is domain.HeartbeatState.IDLE) == self.idle
            and now - self.written_at < self.heartbeat_interval / 2
            and (
                self.credential is None
                or now - self.session_checked < get_settings().SESSION_CHECK_INTERVAL
            )
        )

    async def _answer(self, text_data: str | None) -> None:
        try:
            await self.handle(text_data)
        except domain.InvalidInput as error:
            await self.send_error(error.code, error.message)
        except ClientGone:
            raise
        except SendFailed:
            # The server refused an answer (logged in send): the client must not wait for it.
            if self.attached:
                await self.send_error(
                    "internal_error",
                    gettext("The server failed to handle this frame; try again later."),
                )
        except Exception:
            # A bug or a failure below (database, ...) must not end the connection: it is
            # logged, the client told, and the connection goes on (each handler leaves its
            # state as it found it).
            logger.exception("Presence: handling a frame of user %s failed", self.viewer_id)
            if self.attached:
                await self.send_error(
                    "internal_error",
                    gettext("The server failed to handle this frame; try again later."),
                )

    async def handle(self, text_data: str | None) -> None:
        message = domain.parse_frame(text_data, self.limits, extensions.frame_parsers())
        metrics.frame_received(message)
        handler = self.frame_handlers.get(type(message))
        if handler is not None:
            await getattr(self, handler)(message)
        else:  # a frame type an installed app added (presence.extensions)
            assert isinstance(message, domain.Extension)
            await extensions.frame_handler(message.type)(self, message.message)

    async def afford(self, cost: int) -> bool:
        """Count a frame that weighs ``cost`` frames of RATE_LIMIT (its first was counted on
        arrival); past the limit the connection is closed, and False returned."""
        extra = min(cost, self.rate.frames) - 1
        if extra and not self.rate.allow(time.time(), extra):
            await self.rate_limited()
            return False
        return True

    async def rate_limited(self) -> None:
        logger.info("Presence: closing connection of user %s: rate limit", self.viewer_id)
        await self.close(code=CLOSE_RATE_LIMITED)
        await self.disconnect(CLOSE_RATE_LIMITED)
