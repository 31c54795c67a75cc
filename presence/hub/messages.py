"""Announcements reaching this process (presence.announce): changes go to delivery; a session
that ended (its sockets close) and payloads of topics (presence.extensions) are each handled in
a task of its own, never on the receive loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from presence import extensions
from presence.announce import (
    CHANGED,
    ROOM,
    ROOM_MEMBERS_CHANGED,
    ROOM_RECHECK,
    SESSION_ENDED,
    SESSIONS_CHANGED,
    TOPIC,
    USER_DELETED,
    change_of,
)
from presence.domain import Change, UserId
from presence.hub.registry import Registry
from presence.users import decode_id, id_decoder

if TYPE_CHECKING:  # a sibling of the same layer: only its type is named here
    from presence.hub.rooms import RoomViews

logger = logging.getLogger("presence")

#: a hub's probe of its own channel (presence.hub.hub.Hub.probe): never sent to a group
PROBE = "presence.probe"


class Changed(Protocol):
    def __call__(
        self, user_ids: Iterable[UserId], *, announced_at: float | None, change: Change
    ) -> None: ...


class Messages:
    """Routes announcements; session and topic messages to the connections here."""

    def __init__(
        self,
        registry: Registry,
        topics: extensions.Topics,
        changed: Changed,
        note_lag: Callable[[Any], None],
        rooms: RoomViews,
        probed: Callable[[dict[str, Any]], None] = lambda message: None,
    ) -> None:
        self.registry = registry
        #: what a topic's delivery is handed (the hub)
        self.topics = topics
        #: Hub.changed, and Recovery.note_lag (how late a change was announced)
        self.changed = changed
        self.note_lag = note_lag
        #: topic deliveries under way (cancelled when the hub stops)
        self.delivering: set[asyncio.Task[None]] = set()
        #: the hub's rooms (presence.hub.rooms), told of room announcements
        self.rooms = rooms
        self._session_tasks: set[asyncio.Task[None]] = set()
        #: what each type of announcement does here
        self._acts: dict[str, Callable[[dict[str, Any]], None]] = {
            CHANGED: self.changed_message,
            TOPIC: self.topic_message,
            ROOM: self.room_message,
            ROOM_MEMBERS_CHANGED: self.room_message,
            ROOM_RECHECK: self.room_message,
            SESSION_ENDED: self.session_message,
            SESSIONS_CHANGED: self.session_message,
            USER_DELETED: self.session_message,
            # A probe is back: every announcement sent before it has been acted on.
            PROBE: probed,
        }

    def dispatch(self, message: dict[str, Any]) -> None:
        """Act on one message announced through :mod:`presence.announce`."""
        kind = message.get("type")
        act = self._acts.get(kind) if isinstance(kind, str) else None
        if act is not None:
            act(message)

    def changed_message(self, message: dict[str, Any]) -> None:
        """Users changed: their watchers here are sent what they may see of it."""
        # Ids in their canonical form (presence.users.encode_id), read as the site's pk.
        self.note_lag(message.get("sent"))
        decode = id_decoder()
        at = message.get("at")
        self.changed(
            (decode(uid) for uid in message.get("users", ())),
            announced_at=float(at)
            if isinstance(at, (int, float)) and not isinstance(at, bool)
            else None,
            change=change_of(message),
        )

    def room_message(self, message: dict[str, Any]) -> None:
        """Users joined, left or changed in a room; or what others see of them changed; or a
        room's rule is to be asked again for its members here (``users`` None: all of them)."""
        try:
            decode = id_decoder()
            sent = message.get("users", ())
            users = [decode(uid) for uid in (sent or ())]
        except (TypeError, ValueError):
            return  # not a message of this version's announcer
        if message["type"] == ROOM_RECHECK:
            if isinstance(message.get("room"), str):
                self.rooms.rules.requested(message["room"], None if sent is None else users)
                self.rooms.counts.requested(message["room"], None if sent is None else users)
        elif message["type"] == ROOM_MEMBERS_CHANGED:
            self.rooms.members_changed(users)
        elif isinstance(message.get("room"), str):
            at = message.get("at")
            timed = isinstance(at, int | float) and not isinstance(at, bool)
            self.rooms.changed(message["room"], users, at if timed else None)

    def session_message(self, message: dict[str, Any]) -> None:
        """A session of a user here logged out, or their sessions must be checked again."""
        try:
            user_id = decode_id(message["user"])
        except (KeyError, TypeError, ValueError):
            return  # not a message of this version's announcer
        sockets = list(self.registry.accounts.members.get(user_id, ()))
        if message.get("type") == SESSION_ENDED:
            digest = message.get("session")
            ending = [c for c in sockets if c.credential and c.credential.session_digest == digest]
            calls = [connection.end_session() for connection in ending]
        elif message.get("type") == USER_DELETED:
            calls = [connection.end_account() for connection in sockets]
        else:
            calls = [connection.recheck_session() for connection in sockets]
        if calls:
            # Not on the receive loop: closing detaches, which may stop this hub's tasks.
            task = asyncio.ensure_future(self._run_session_calls(calls))
            self._session_tasks.add(task)
            task.add_done_callback(self._session_tasks.discard)

    async def _run_session_calls(self, calls: list[Coroutine[Any, Any, None]]) -> None:
        for call in calls:
            try:
                await call
            except Exception:
                logger.exception("Presence: closing the sockets of an ended session failed")

    def topic_message(self, message: dict[str, Any]) -> None:
        """Hand a payload announced to a topic kind to its registered delivery, in a task of
        its own (a slow delivery must not hold up the receive loop)."""
        kind = message.get("kind")
        if not isinstance(kind, str):
            return
        payload = message.get("payload")
        deliver = extensions.delivery(kind)
        if deliver is None or not self.registry.topics.members.get(kind):
            return
        task = asyncio.ensure_future(self._deliver_topic(deliver, kind, payload))
        self.delivering.add(task)
        task.add_done_callback(self.delivering.discard)

    async def _deliver_topic(self, deliver: extensions.Deliver, kind: str, payload: Any) -> None:
        try:
            await deliver(self.topics, payload)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Presence: delivering a %s message failed", kind)
