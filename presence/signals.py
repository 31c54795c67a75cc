"""The signals presence sends. Receivers live elsewhere (presence.receivers, site code).

``user_online`` and ``user_offline`` are sent once per transition on the whole site: the Lua
script that makes a transition settles it in the store's online ledger atomically, so exactly
one write (of one process) is told "this call made the user online" (or offline), and that
process sends the signal (:func:`send_transition`). ``room_entered`` and ``room_left`` the
same way: the room's script that adds or removes the member records it in the room's outbox
(presence.outbox). Receivers run on one worker thread of the process, never on the event loop
or in the write's path, one after another in the order the transitions were made there; one
that raises is logged and the others still run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from django.db import close_old_connections
from django.dispatch import Signal

logger = logging.getLogger("presence")

#: Sent after commit when what others may see of ``user_id`` may have changed for a reason other
#: than activity: ``reason`` is "status" (set_status), "privacy" (PrivacySettings saved or
#: deleted), "contacts" (a Contact of user_id's added, changed or removed) or "block" (sent for
#: both users). One change can send more than one (set_status also saves PrivacySettings);
#: listeners should coalesce. The live layer listens to push updates to open connections.
presence_changed = Signal()

#: Sent once on the whole site when ``user_id`` comes online as their friends see it (a first
#: connection or request after being offline): ``at`` (aware datetime, UTC) when, ``invisible``
#: whether the user chose to look offline to everyone (their friends see nothing then).
user_online = Signal()

#: Sent once on the whole site when ``user_id`` goes offline as their friends see it:
#: OFFLINE_GRACE after their last connection closed (or they logged out), CONNECTION_TTL after a
#: crashed connection was last heard from, ONLINE_WINDOW after the last page view of a user seen
#: only by page views; noticed by the sweep of any live process (within SWEEP_INTERVAL), or by
#: ``presence_cleanup`` on a site without one. ``at`` is when the user turned offline.
user_offline = Signal()

#: Sent once on the whole site when ``user_id`` enters ``room`` (``"kind:id"``): their first
#: connection joined it (a join, or a heartbeat that finds their stay ended and joins again).
#: ``at`` (aware datetime, UTC) when. Sent for every member, invisible ones too.
room_entered = Signal()

#: Sent once on the whole site when ``user_id`` leaves ``room``: OFFLINE_GRACE after their last
#: connection there left or closed, CONNECTION_TTL after a crashed one was last heard from
#: (noticed by the room's sweep on any live process, within SWEEP_INTERVAL), or at once when
#: the room's rule refuses them or the user is deleted. ``at`` is when their stay ended.
room_left = Signal()

_NAMES = {
    user_online: "user_online",
    user_offline: "user_offline",
    room_entered: "room_entered",
    room_left: "room_left",
}

#: the receivers' one thread in this process (created on first use)
_worker: ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _worker
    if _worker is None:
        with _worker_lock:
            if _worker is None:
                _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="presence-signals")
    return _worker


#: whether the user chose to be invisible, or what tells it on the receivers' thread (a choice
#: the store could not tell: presence.copies.chose_invisible reads the database there)
Invisible = bool | Callable[[], bool]


def send_transition(user_id: Any, made: int, at: float | None, invisible: Invisible) -> None:
    """Send ``user_online`` (``made`` 1) or ``user_offline`` (-1) for ``user_id`` on the
    receivers' thread; returns at once. ``made`` comes from the store's reply (0: nothing)."""
    if made == 0 or at is None:
        return
    _submit(None, user_online if made > 0 else user_offline, user_id, at, invisible=invisible)


def send_if_claimed(
    claim: Callable[[], bool], user_id: Any, made: int, at: float, invisible: Invisible
) -> None:
    """Like :func:`send_transition`, once ``claim()`` (run on the receivers' thread, right
    before the receivers) says this process won the transition's outbox entry
    (presence.outbox): an entry not claimed here is left to the sweep, which sends it."""
    _submit(claim, user_online if made > 0 else user_offline, user_id, at, invisible=invisible)


def send_room_transition(
    user_id: Any, room: str, made: int, at: float, claim: Callable[[], bool] | None = None
) -> None:
    """Send ``room_entered`` (``made`` 1) or ``room_left`` (-1) for ``user_id`` and ``room`` on
    the receivers' thread, once ``claim()`` (if given) says this process won its outbox
    entry; returns at once."""
    if made == 0:
        return
    _submit(claim, room_entered if made > 0 else room_left, user_id, at, room=room)


def _submit(
    claim: Callable[[], bool] | None, signal: Signal, user_id: Any, at: float, **arguments: Any
) -> None:
    when = datetime.fromtimestamp(at, tz=UTC)

    def claim_and_send() -> None:
        if claim is not None:
            try:
                claimed = claim()
            except Exception:
                logger.exception(
                    "Presence: claiming the signal %s of user %s failed", _NAMES[signal], user_id
                )
                return
            if not claimed:
                return
        told = arguments.get("invisible")
        if callable(told):
            arguments["invisible"] = told()
        _send(signal, user_id, when, arguments)

    _executor().submit(claim_and_send)


def _send(signal: Signal, user_id: Any, at: datetime, arguments: dict[str, Any]) -> None:
    try:
        for receiver, result in signal.send_robust(
            sender=None, user_id=user_id, at=at, **arguments
        ):
            if isinstance(result, Exception):
                logger.error(
                    "Presence: a receiver of %s (%r) raised for user %s",
                    _NAMES[signal],
                    receiver,
                    user_id,
                    exc_info=result,
                )
    finally:
        # Receivers may use the database on this thread: as at the end of a request.
        close_old_connections()


def wait_sent(timeout: float | None = 10.0) -> None:
    """Block until every transition this process sent so far has reached its receivers (tests,
    and a management command's end)."""
    done: Future[None] = _executor().submit(lambda: None)
    done.result(timeout)
