"""Sockets close with the session or token they were opened with (logout, password change,
deactivation, expiry; presence.sessions): the re-checks the hub and heartbeats ask for.

Checks are made in bulk, per process (event loop): a socket whose check is due takes every
socket of the process at least half an interval past its last check along, and one
:func:`presence.sessions.invalid_among` call (a query for the sessions, one for the users)
judges them all. So a process makes about one check per ``SESSION_CHECK_INTERVAL`` whatever its
number of sockets, instead of one per socket.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterable

from asgiref.sync import sync_to_async

from presence import lifecycle, sessions
from presence.conf import get_settings
from presence.consumers.limits import CLOSE_UNAUTHENTICATED
from presence.consumers.state import Socket
from presence.domain import passed
from presence.store import Plan, get_store

logger = logging.getLogger("presence")


class Credentials:
    """A connection's credential checks: ending it once its credential
    (``socket.credential``) no longer holds."""

    def __init__(self, socket: Socket) -> None:
        self.socket = socket
        if socket.credential is not None:
            SessionChecks.get().sockets.add(self)

    async def end_session(self) -> None:
        """Its session ended (logout, password change): closed with 4401 like an anonymous
        connection, and gone for presence at once."""
        socket = self.socket
        if not socket.attached:
            return
        logger.info("Presence: closing connection of user %s: session ended", socket.viewer_id)
        await socket.close(code=CLOSE_UNAUTHENTICATED)
        await socket.disconnect(CLOSE_UNAUTHENTICATED)

    async def end_account(self) -> None:
        """Its user was deleted: closed with 4401, out of its rooms at once (no grace), and
        what its own close wrote of the user erased again (the deleting process erased the
        rest already; lifecycle.aerase_user)."""
        socket = self.socket
        if not socket.attached:
            return
        logger.info("Presence: closing connection of user %s: user deleted", socket.viewer_id)
        socket.state.account_deleted = True
        await socket.close(code=CLOSE_UNAUTHENTICATED)
        await socket.disconnect(CLOSE_UNAUTHENTICATED)
        await lifecycle.aerase_user(socket.viewer_id)

    def checkable(self) -> bool:
        """Whether the socket is open with a credential to check."""
        return self.socket.attached and self.socket.credential is not None

    def due(self, now: float, after: float) -> bool:
        """Whether it is checkable and was last checked ``after`` seconds or more before
        ``now``."""
        return self.checkable() and passed(now, self.socket.state.session_checked, after)

    async def recheck_session(self) -> None:
        """Check this socket's credential now (closing it if it no longer holds), together
        with the process's other sockets that are half an interval or more past their check."""
        if self.socket.credential is None or not self.socket.attached:
            return
        now = time.time()
        half = get_settings().SESSION_CHECK_INTERVAL / 2
        checks = SessionChecks.get()
        along = [c for c in checks.sockets if c is not self and c.due(now, half)]
        due = [self, *along]
        for credentials in due:
            credentials.socket.state.session_checked = now
        await checks.check(due)

    def recent_ends_check(self) -> Plan[tuple[bool, bool]]:
        """The read of recent logouts and password changes (presence.sessions) that rides along
        with the connection's opening write (lifecycle.aconnect_checking)."""
        assert self.socket.credential is not None
        return sessions.recent_ends_plan(get_store(), self.socket.viewer_id, self.socket.credential)

    async def ended_meanwhile(self, ended: bool, changed: bool) -> bool:
        """A logout or password change announced between the handshake's read of the session
        and the hub's join of the account group reached no socket here: its mark in Redis
        does (``ended``, ``changed``: :meth:`recent_ends_check`'s answer, read once the group
        was joined). Whether the connection was closed for it."""
        if ended:
            await self.end_session()
        elif changed:
            await self.recheck_session()
        return not self.socket.attached


_checks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SessionChecks] = (
    weakref.WeakKeyDictionary()
)


class SessionChecks:
    """The process's (event loop's) credential checks: sockets asked for while a check runs
    wait for the next one (the running one may have read before a logout), which then judges
    them all at once."""

    def __init__(self) -> None:
        #: the sockets of this process (event loop) that have a credential to check
        self.sockets: weakref.WeakSet[Credentials] = weakref.WeakSet()
        #: the sockets of the next check (a dict as an ordered set)
        self.waiting: dict[Credentials, None] = {}
        #: done when the next check has judged (and closed) its sockets
        self.next: asyncio.Future[None] | None = None
        self.running: asyncio.Task[None] | None = None

    @classmethod
    def get(cls) -> SessionChecks:
        loop = asyncio.get_running_loop()
        checks = _checks.get(loop)
        if checks is None:
            checks = _checks[loop] = cls()
        return checks

    async def check(self, connections: Iterable[Credentials]) -> None:
        """Judge these sockets' credentials in the next check; returns once it has."""
        self.waiting.update(dict.fromkeys(connections))
        if self.next is None:
            self.next = asyncio.get_running_loop().create_future()
        judged = self.next
        if self.running is None or self.running.done():
            self.running = asyncio.ensure_future(self._run())
        await asyncio.shield(judged)

    async def _run(self) -> None:
        while self.next is not None:
            judged, self.next = self.next, None
            batch = [c for c in self.waiting if c.checkable()]
            self.waiting = {}
            try:
                await self._judge(batch)
            finally:
                if not judged.done():
                    judged.set_result(None)

    async def _judge(self, batch: list[Credentials]) -> None:
        if not batch:
            return
        try:
            invalid = await sync_to_async(sessions.invalid_among)(
                [
                    (c.socket.credential, c.socket.viewer_id)
                    for c in batch
                    if c.socket.credential is not None
                ]
            )
        except Exception:
            # The database failed: nobody is closed for it; the next check comes.
            logger.exception("Presence: checking the sockets' sessions failed")
            return
        for connection, ended in zip(batch, invalid, strict=True):
            if ended:
                try:
                    await connection.end_session()
                except Exception:
                    logger.exception("Presence: closing a socket of an ended session failed")
