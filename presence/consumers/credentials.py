"""Sockets close with the session or token they were opened with (logout, password change,
deactivation, expiry; presence.sessions): the re-checks the hub and heartbeats ask for."""

from __future__ import annotations

import logging
import time

from asgiref.sync import sync_to_async

from presence import sessions
from presence.consumers.base import ConsumerBase
from presence.consumers.limits import CLOSE_UNAUTHENTICATED
from presence.store import get_store

logger = logging.getLogger("presence")


class Credentials(ConsumerBase):
    """Ending a connection whose credential (``self.credential``) no longer holds."""

    async def end_session(self) -> None:
        """Its session ended (logout, password change): closed with 4401 like an anonymous
        connection, and gone for presence at once."""
        if not self.attached:
            return
        logger.info("Presence: closing connection of user %s: session ended", self.viewer_id)
        await self.close(code=CLOSE_UNAUTHENTICATED)
        await self.disconnect(CLOSE_UNAUTHENTICATED)

    async def recheck_session(self) -> None:
        credential = self.credential
        if credential is None or not self.attached:
            return
        self.session_checked = time.time()
        valid = await sync_to_async(credential.is_valid)(self.viewer_id)
        if not valid:
            await self.end_session()

    async def _ended_meanwhile(self) -> bool:
        """A logout or password change announced between the handshake's read of the session
        and the hub's join of the account group reached no socket here: its mark in Redis
        does. Whether the connection was closed for it."""
        assert self.credential is not None
        store = get_store()
        ended, changed = await store.arun(
            sessions.recent_ends_plan(store, self.viewer_id, self.credential), live=True
        )
        if ended:
            await self.end_session()
        elif changed:
            await self.recheck_session()
        return not self.attached
