"""Choosing a status: auto, dnd or invisible, and a custom status that may expire; do not
disturb alone (:func:`set_dnd`), invisibility and the custom status kept."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from presence import announce, copies, domain, resolution
from presence.api._privacy import refuse_unknown_user
from presence.api._reading import _get_presence
from presence.domain import InvalidInput, Presence, StatusChange, StatusChoice
from presence.models import PrivacySettings, UserStatus
from presence.operations import Operation, arun, call, run
from presence.store.plans.ledger import Choices
from presence.users import user_pk as _pk


def _change(
    status: str,
    text: str | None,
    emoji: str | None,
    activity: str | None,
    expires_at: datetime | None,
) -> tuple[StatusChange, datetime | None]:
    expires_in: float | None = None
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise InvalidInput("invalid_value", "expires_at must be an aware datetime.")
        expires_in = (expires_at - timezone.now()).total_seconds()
        if expires_in < 1:
            raise InvalidInput("invalid_value", "expires_at must be in the future.")
    change = domain.parse_status_change(
        {
            "status": status,
            "text": text,
            "emoji": emoji,
            "activity": activity,
            "expires_in": expires_in,
        },
        resolution.limits(),
    )
    return change, expires_at


#: set while the API saves a status row: the row's receivers leave its announcement to it
_saving_through_the_api: ContextVar[bool] = ContextVar("presence_saving_status", default=False)


def saving_through_the_api() -> bool:
    """Whether the UserStatus row being saved is the API's (:func:`set_status`), which
    announces the change itself; else a row saved by the site or the admin."""
    return _saving_through_the_api.get()


def status_row_changed(
    user_id: Any, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> None:
    """A UserStatus row saved or deleted by the site or the admin (``before``/``after``: its
    fields, None for no row): announced after commit with what it changed, and its custom
    status's end scheduled as :func:`set_status` schedules it (the live layer clears it then)."""
    change = domain.status_change(before, after)
    if not change.kinds:
        return

    def announce_it() -> None:
        # Redis's copy of the choices, from the database (presence.copies: written again
        # later if Redis does not take it now, or the database cannot be read; never raising
        # out of this hook, so the announcement follows whatever happened to it).
        copies.after_commit(copies.from_database([user_id]), [user_id])
        announce.changed([user_id], "status", sender=UserStatus, change=change)

    transaction.on_commit(announce_it)


def _save(user_id: Any, change: StatusChange, expires_at: datetime | None, copy: Choices) -> bool:
    """The rows of a status change, in one transaction; announced after commit (the caller's
    commit, inside its ``atomic``; from the event loop that called, for an async caller), with
    what it changed: a viewer who cannot see that is not told (domain.Change.seen_by).

    Inside the caller's ``atomic``, Redis's copy of the choices (``copy``) is written once it
    commits, and True returned: a change rolled back must not reach Redis, and the check after
    the write must read the committed rows. Else (False) the caller writes it."""
    in_callers_transaction = transaction.get_connection().in_atomic_block
    fields = {
        "dnd": change.status is StatusChoice.DND,
        "text": change.text or "",
        "emoji": change.emoji or "",
        "activity": change.activity or "",
        "expires_at": expires_at,
    }
    invisible = change.status is StatusChoice.INVISIBLE
    with transaction.atomic():
        before = (
            UserStatus.objects.select_for_update()
            .filter(user_id=user_id)
            .values(*domain.STATUS_FIELDS)
            .first()
        )
        saving = _saving_through_the_api.set(True)  # (announced below, not by the receivers)
        try:
            UserStatus.objects.update_or_create(user_id=user_id, defaults=fields)
        finally:
            _saving_through_the_api.reset(saving)
        # Without signals (a saved PrivacySettings announces "privacy"): this change's own
        # announcement below covers it, so viewers are told once.
        was = (
            PrivacySettings.objects.select_for_update()
            .filter(user_id=user_id)
            .values_list("invisible", flat=True)
            .first()
        )
        if was is None:
            PrivacySettings.objects.bulk_create(
                [PrivacySettings(user_id=user_id, invisible=invisible)], ignore_conflicts=True
            )
        elif was != invisible:
            PrivacySettings.objects.filter(user_id=user_id).update(invisible=invisible)
        invisible_changed = bool(was) != invisible  # no row: visible
        kinds = domain.status_change(before, fields).kinds
        if invisible_changed:
            kinds |= domain.Kind.INVISIBLE
        what = domain.Change(kinds)
        if in_callers_transaction:
            transaction.on_commit(
                lambda: copies.after_commit(copies.write({user_id: copy}), [user_id])
            )
        transaction.on_commit(
            lambda: announce.changed([user_id], "status", sender=UserStatus, change=what)
        )
    return in_callers_transaction


def _apply_change(
    user: Any, change: StatusChange, expires_at: datetime | None
) -> Operation[Presence]:
    if expires_at is None and change.expires_in is not None:
        expires_at = timezone.now() + timedelta(seconds=change.expires_in)
    has_custom = any((change.text, change.emoji, change.activity))
    # Redis's copy of the choices (one round trip): the online count and the ledger's signals
    # leave invisible users out, and the live layer announces the custom status clearing by
    # itself when it expires. Checked against the database after (another device's change
    # committed meanwhile), and written again later if Redis does not take it (presence.copies).
    ends = expires_at.timestamp() if has_custom and expires_at else None
    copy: Choices = (change.status is StatusChoice.INVISIBLE, ends)
    left_to_commit = yield from call(
        _save, _pk(user), change, expires_at if has_custom else None, copy
    )
    if not left_to_commit:  # (committed: written now; else once the caller's commit is)
        yield from copies.write({_pk(user): copy})
    return (yield from _get_presence(user, user))


def apply_change(user: Any, change: StatusChange, expires_at: datetime | None = None) -> Presence:
    """Store a validated status change and return the user's own presence."""
    return run(_apply_change(user, change, expires_at))


async def aapply_change(
    user: Any, change: StatusChange, expires_at: datetime | None = None
) -> Presence:
    async with _one_at_a_time(_pk(user)):
        return await arun(_apply_change(user, change, expires_at))


#: per event loop, the users with a status change under way there: a lock, and how many hold
#: or wait for it
_changing: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[Any, tuple[asyncio.Lock, int]]
] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def _one_at_a_time(user_id: Any) -> AsyncIterator[None]:
    """The status changes of one user on this event loop (the sockets of their tabs, say) are
    made one at a time: the rows, the Redis copy and the presence returned are of one change,
    though its steps take turns with other work on the loop."""
    changing = _changing.setdefault(asyncio.get_running_loop(), {})
    lock, users = changing.get(user_id, (asyncio.Lock(), 0))
    changing[user_id] = (lock, users + 1)
    try:
        async with lock:
            yield
    finally:
        lock, users = changing.pop(user_id)
        if users > 1:
            changing[user_id] = (lock, users - 1)


def _set_status(
    user: Any,
    status: str,
    text: str | None,
    emoji: str | None,
    activity: str | None,
    expires_at: datetime | None,
) -> Operation[Presence]:
    change, expires_at = _change(status, text, emoji, activity, expires_at)
    return (yield from _apply_change(user, change, expires_at))


def set_status(
    user: Any,
    status: str,
    text: str | None = None,
    emoji: str | None = None,
    activity: str | None = None,
    expires_at: datetime | None = None,
) -> Presence:
    """Choose ``auto``, ``dnd`` or ``invisible`` and a custom status clearing at ``expires_at``.

    Raises :class:`InvalidInput` (a ``ValueError``) naming what is wrong; nothing is saved then.
    """
    return run(_set_status(user, status, text, emoji, activity, expires_at))


async def aset_status(
    user: Any,
    status: str,
    text: str | None = None,
    emoji: str | None = None,
    activity: str | None = None,
    expires_at: datetime | None = None,
) -> Presence:
    async with _one_at_a_time(_pk(user)):
        return await arun(_set_status(user, status, text, emoji, activity, expires_at))


def _set_dnd(user: Any, dnd: bool) -> bool:
    if not isinstance(dnd, bool):
        raise InvalidInput("invalid_value", f"dnd must be True or False; got {dnd!r}.")
    user_id = _pk(user)
    with transaction.atomic():
        was = (
            UserStatus.objects.select_for_update()
            .filter(user_id=user_id)
            .values_list("dnd", flat=True)
            .first()
        )
        if was is None:
            refuse_unknown_user(user_id)
        if bool(was) == dnd:  # (no row: not dnd)
            return False
        # Through the model, as the admin saves a row: its receivers announce the change after
        # commit to those who may see it (an invisible user's contacts see nothing change) and
        # keep Redis's copy of the choices from the database (status_row_changed). The
        # PrivacySettings row is not touched: invisible stays as the user chose it.
        UserStatus.objects.update_or_create(user_id=user_id, defaults={"dnd": dnd})
    return True


def set_dnd(user: Any, dnd: bool) -> bool:
    """Turn do not disturb on (``True``) or off (``False``), and nothing else: a user who chose
    to be invisible stays invisible (``set_status(user, "dnd")`` would make them visible: its
    status is the one choice among auto, dnd and invisible), and the custom status text, emoji,
    activity and when they clear stay as they are. True if that changed anything.

    Saves ``UserStatus.dnd`` through the model: open connections of those who may see the user
    online are told after commit (the caller's, inside its ``atomic``; nothing if it rolls
    back). Raises :class:`InvalidInput` (``invalid_value``: not a bool; ``unknown_users``: an
    id of no user); nothing is saved then."""
    return run(call(_set_dnd, user, dnd))


async def aset_dnd(user: Any, dnd: bool) -> bool:
    # One at a time with this loop's other status changes of the user (aset_status's sockets).
    async with _one_at_a_time(_pk(user)):
        return await arun(call(_set_dnd, user, dnd))
