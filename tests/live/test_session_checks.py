"""Sessions checked in bulk: a process judges all its sockets' sessions in a few queries per
SESSION_CHECK_INTERVAL, not one (or two) per socket, and still closes the socket of a session
that ended. Helpers: tests/live/sockets.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db.backends import utils

from presence.store import PresenceStore
from tests.live.sockets import (
    Sockets,
    _logged_in_client,
    _site_socket,
    assert_closed_with,
    heartbeat,
    new_user,
    presence_settings,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

SOCKETS = 20
INTERVAL = 40
BEAT = 10


@pytest.fixture
def credential_queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Statements reading sessions or users, from every thread (the checks run in the one
    database thread of sync_to_async)."""
    seen: list[str] = []
    tables = ("django_session", get_user_model()._meta.db_table)
    real = utils.CursorWrapper.execute

    def counting(self: Any, sql: str, params: Any = None) -> Any:
        if any(table in sql for table in tables):
            seen.append(sql)
        return real(self, sql, params)

    monkeypatch.setattr(utils.CursorWrapper, "execute", counting)
    return seen


async def test_a_process_checks_all_its_sockets_sessions_in_two_queries_per_interval(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    credential_queries: list[str],
) -> None:
    with presence_settings(HEARTBEAT_INTERVAL=BEAT, SESSION_CHECK_INTERVAL=INTERVAL):
        users = [await new_user(make_user) for _ in range(SOCKETS)]
        clients = [await sync_to_async(_logged_in_client)(user) for user in users]
        opened = [await _site_socket(sockets, client) for client in clients]
        credential_queries.clear()
        intervals = 3
        for _ in range(intervals * INTERVAL // BEAT):
            clock.shift(BEAT)
            for socket in opened:
                await heartbeat(socket)
        # One session query and one user query per interval; one socket per socket each
        # interval would be 2 * 20 * 3.
        assert 1 <= len(credential_queries) <= 2 * intervals

        # The bulk check still closes a socket whose session ended, and only that one.
        await sync_to_async(clients[3].session.delete)()
        for _ in range(INTERVAL // BEAT):
            clock.shift(BEAT)
            for n, socket in enumerate(opened):
                if n == 3:
                    await socket.send_json_to({"type": "heartbeat", "state": "active"})
                else:
                    await heartbeat(socket)
        await assert_closed_with(opened[3], 4401)
        for socket in opened[4:6]:
            await heartbeat(socket)


async def test_the_read_of_recent_logouts_rides_along_with_the_opening_write(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A page view opens a socket: the read of recent logouts costs it no round trip of its own.
    sent: list[list[str]] = []
    real = PresenceStore.arun

    async def recording(self: PresenceStore, plan: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append([str(command[0]).upper() for command in plan.commands])
        return await real(self, plan, *args, **kwargs)

    monkeypatch.setattr(PresenceStore, "arun", recording)
    user = await new_user(make_user)
    client = await sync_to_async(_logged_in_client)(user)
    await _site_socket(sockets, client)
    with_reads = [commands for commands in sent if "EXISTS" in commands]
    assert with_reads, sent
    assert all(set(commands) - {"EXISTS"} for commands in with_reads), sent
