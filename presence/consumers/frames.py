"""Receiving a connection's client frames: rate-limited, parsed and handed to the handler of
their type in the one registry of the socket's frames (:data:`presence.frames.FRAMES`: presence's
own, rooms', and those installed apps add)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.utils.translation import gettext

from presence import announce, domain, metrics
from presence.conf import get_settings
from presence.consumers.limits import (
    ANSWER_BYTES_PER_FRAME,
    CLOSE_RATE_LIMITED,
    answer_bytes,
)
from presence.consumers.sending import ClientGone, SendFailed
from presence.consumers.state import Socket
from presence.domain import passed
from presence.domain.protocol import RoomFrame
from presence.frames import ANSWERS, FRAMES
from presence.operations import being_cancelled

logger = logging.getLogger("presence")


@dataclass
class _Answering:
    """The frame a socket is answering, and what every error answering it names: its type
    ("answers", where the site accepts it), the room of a join, leave or room_more ("room"),
    the field an added frame type is named by (the feed's "feed"), so that a client tells it
    from the answer of another request (errors carry no request id). Filled by _handle as the
    frame is parsed."""

    socket: Socket | None
    named: dict[str, str] = field(default_factory=dict)


#: the answer under way in this task (tasks it starts inherit it: hence the socket, and
#: _answer letting go of it once the answer is over)
_answered: ContextVar[_Answering | None] = ContextVar("presence_answered", default=None)


def answering(socket: Socket) -> dict[str, str]:
    """What an error sent to ``socket`` now names: that of the frame this task is answering for
    it (a handler's own error: rate_limited, unknown_users, an extension's), nothing where the
    error answers no frame of it (unprompted, or sent to another socket)."""
    current = _answered.get()
    if current is None or current.socket is not socket:
        return {}
    return dict(current.named)


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


async def receive(socket: Socket, text_data: str | None) -> None:
    """A frame within RATE_LIMIT is parsed and answered; its failures are told to the client,
    and the connection goes on."""
    if not socket.attached:
        return
    arrived = time.time()
    rate = socket.state.rate
    if not rate.allow(arrived):
        await rate_limited(socket)
        return
    await answer(socket, arrived, _handle(socket, text_data))


async def answer(
    socket: Socket,
    arrived: float,
    work: Coroutine[Any, Any, None],
    answers: str | None = None,
) -> None:
    """Run ``work``, the answer to a client's request (a frame, or the subscription of the
    opening request) that arrived at ``arrived``: its failures are told to the client, the
    connection goes on, and the answer's bytes weigh against RATE_LIMIT. ``answers``: the type
    of frame its errors name, where no frame's type is parsed (the opening request's)."""
    answered = [0]
    counting = answer_bytes.set(answered)
    try:
        # What this frame changes is announced as made when it arrived (coalescing windows
        # count from then: see Hub.changed).
        with announce.change_started_at(arrived):
            await _answer(socket, work, answers)
    except ClientGone:
        # Its websocket.disconnect is queued behind this frame, and will clean up.
        logger.debug("Presence: user %s left while a frame was answered", socket.viewer_id)
    except SendFailed:
        pass  # logged where it failed; even the error frame telling the client was refused
    finally:
        answer_bytes.reset(counting)
    # A small frame may ask for a large answer (a snapshot): its bytes weigh too.
    extra = answered[0] // ANSWER_BYTES_PER_FRAME
    if extra and socket.attached:
        socket.state.rate.charge(time.time(), extra)


async def _handle(socket: Socket, text_data: str | None) -> None:
    current = _answered.get()
    named = None if current is None else current.named
    message = FRAMES.parse(text_data, socket.state.limits, named)
    metrics.frame_received(message)
    if isinstance(message, RoomFrame) and named is not None:
        named["room"] = message.room.name
    await FRAMES.handle(socket, message)


def beat_quietly(socket: Socket, text_data: str | None) -> bool:
    """Handle ``text_data`` on arrival if it is a heartbeat that changes nothing (True):
    without a parse or a handler's coroutines, it writes, answers and announces nothing, as
    the heartbeat handler would. Other frames are left to :func:`receive` (False)."""
    beat = _HEARTBEATS.get(text_data) if text_data is not None else None
    if beat is None or not socket.attached:
        return False
    arrived = time.time()
    if not _beats_quietly(socket, beat, arrived) or not socket.state.rate.allow(arrived):
        return False  # the handler's to write, or receive's to close past RATE_LIMIT
    metrics.frame_received(beat)
    return True


def _beats_quietly(socket: Socket, beat: domain.Heartbeat, now: float) -> bool:
    """Whether the heartbeat handler would do nothing with ``beat``: its idle state is the one
    written, its last write is within half a HEARTBEAT_INTERVAL (the connection is recorded
    alive for CONNECTION_TTL anyway), no session check and no fresh stamp is due."""
    state = socket.state
    return (
        (beat.state is domain.HeartbeatState.IDLE) == state.idle
        and not passed(now, state.written_at, state.heartbeat_interval / 2)
        and not state.subscriptions.restamp_due(now)
        and (
            socket.credential is None
            or not passed(now, state.session_checked, get_settings().SESSION_CHECK_INTERVAL)
        )
    )


async def _answer(socket: Socket, work: Coroutine[Any, Any, None], answers: str | None) -> None:
    current = _Answering(socket, {} if answers is None else {ANSWERS: answers})
    token = _answered.set(current)
    try:
        await _answer_naming(socket, work)
    finally:
        _answered.reset(token)
        # A task the answer started may outlive it: what it sends later answers nothing.
        current.socket = None
        current.named.clear()


def _named(error: domain.InvalidInput | None = None) -> dict[str, str]:
    """What an error answering the frame names: its type (``answers``), its ``room`` (a room's
    frame), the field of an added type's ``named_by`` (the feed's ``feed``)."""
    current = _answered.get()
    named = {} if current is None else dict(current.named)
    if error is not None and error.room is not None:
        named["room"] = error.room
    return named


async def _answer_naming(socket: Socket, work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    except domain.InvalidInput as error:
        await socket.send_error(error.code, error.message, **_named(error))
    except ClientGone:
        raise
    except asyncio.CancelledError:
        if being_cancelled():
            raise  # the connection's own cancellation (the server stopping it)
        # A CancelledError of something the answer awaited: a bug below, not a cancellation
        # of this connection. Raised on, it would end the consumer with its socket left open.
        logger.error(
            "Presence: handling a frame of user %s failed: cancelled below it",
            socket.viewer_id,
            exc_info=True,
        )
        if socket.attached:
            await socket.send_error(
                "internal_error",
                gettext("The server failed to handle this frame; try again later."),
                **_named(),
            )
    except SendFailed:
        # The server refused an answer (logged in send): the client must not wait for it.
        if socket.attached:
            await socket.send_error(
                "internal_error",
                gettext("The server failed to handle this frame; try again later."),
                **_named(),
            )
    except Exception:
        # A bug or a failure below (database, ...) must not end the connection: it is logged,
        # the client told, and the connection goes on (each handler leaves its state as it
        # found it).
        logger.exception("Presence: handling a frame of user %s failed", socket.viewer_id)
        if socket.attached:
            await socket.send_error(
                "internal_error",
                gettext("The server failed to handle this frame; try again later."),
                **_named(),
            )


async def afford(socket: Socket, cost: int) -> bool:
    """Count a frame that weighs ``cost`` frames of RATE_LIMIT (its first was counted on
    arrival); past the limit the connection is closed, and False returned."""
    rate = socket.state.rate
    extra = min(cost, rate.frames) - 1
    if extra and not rate.allow(time.time(), extra):
        await rate_limited(socket)
        return False
    return True


async def rate_limited(socket: Socket) -> None:
    logger.info("Presence: closing connection of user %s: rate limit", socket.viewer_id)
    await socket.close(code=CLOSE_RATE_LIMITED)
    await socket.disconnect(CLOSE_RATE_LIMITED)
