"""A user's privacy choices from code: their three levels (:func:`set_privacy`) and whether
they are invisible (:func:`set_invisible`), saved through the PrivacySettings model as the
settings page and the admin save them, so its receivers tell open sockets after commit and keep
Redis's copy of invisible in step (presence.receivers, presence.copies). Each write is an
operation of one database call, run as the contacts' are (presence.api._contacts)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from presence.domain import VISIBILITY_SETTINGS, InvalidInput, Visibility
from presence.models import PrivacySettings, privacy_defaults
from presence.operations import arun, call, run
from presence.users import user_pk as _pk

_LEVELS = ", ".join(level.value for level in Visibility)


def _checked_levels(levels: dict[str, Any]) -> dict[str, str]:
    """The levels as the row stores them; InvalidInput naming the first one at fault."""
    checked: dict[str, str] = {}
    for name, value in levels.items():
        if name == "invisible":
            raise InvalidInput(
                "invalid_value", "invisible is not a level: use set_invisible(user, True)."
            )
        if name not in VISIBILITY_SETTINGS:
            raise InvalidInput(
                "invalid_value",
                f"{name} is not a privacy level; the levels are {', '.join(VISIBILITY_SETTINGS)}.",
            )
        try:
            checked[name] = Visibility(value).value
        except ValueError:
            raise InvalidInput(
                "invalid_value", f"{name} must be one of {_LEVELS}; got {value!r}."
            ) from None
    return checked


def _locked_row(user_id: Any) -> dict[str, Any] | None:
    """The user's PrivacySettings row, locked until the transaction ends (None: no row, the
    site's defaults). InvalidInput for an id of no user (a row for it could not be saved).
    ``user_id``: Any, the site's pk type (presence.users.user_pk)."""
    row: dict[str, Any] | None = (
        PrivacySettings.objects.select_for_update()
        .filter(user_id=user_id)
        .values(*VISIBILITY_SETTINGS, "invisible")
        .first()
    )
    if row is None:
        refuse_unknown_user(user_id)
    return row


def refuse_unknown_user(user_id: Any) -> None:
    """InvalidInput ``unknown_users`` for an id of no user (asked when a user has no row: a
    row for that id could not be saved)."""
    if not get_user_model()._default_manager.filter(pk=user_id).exists():
        raise InvalidInput("unknown_users", f"No user has the id {user_id}.")


def _save(user_id: Any, changed: dict[str, Any]) -> None:
    # Through the model (update_or_create saves the instance, these fields only): the receivers
    # announce the change and copy invisible to Redis after commit. A row it creates starts
    # from the site's DEFAULT_PRIVACY for the fields not given (the fields' defaults).
    PrivacySettings.objects.update_or_create(user_id=user_id, defaults=changed)


def _set_privacy(user: Any, levels: dict[str, Any]) -> bool:
    wanted = _checked_levels(levels)
    if not wanted:
        return False
    user_id = _pk(user)
    with transaction.atomic():
        row = _locked_row(user_id)
        if row is None:
            # No row follows DEFAULT_PRIVACY: one is made only for a level that differs from it.
            defaults = privacy_defaults()
            row = {name: getattr(defaults, name).value for name in VISIBILITY_SETTINGS}
        changed = {name: value for name, value in wanted.items() if value != row[name]}
        if not changed:
            return False
        _save(user_id, changed)
    return True


def _set_invisible(user: Any, invisible: bool) -> bool:
    if not isinstance(invisible, bool):
        raise InvalidInput("invalid_value", f"invisible must be True or False; got {invisible!r}.")
    user_id = _pk(user)
    with transaction.atomic():
        row = _locked_row(user_id)
        if bool(row and row["invisible"]) == invisible:  # (no row: visible)
            return False
        _save(user_id, {"invisible": invisible})
    return True


def set_privacy(user: Any, **levels: Any) -> bool:
    """Set some of the user's levels (``online_visibility``, ``last_seen_visibility``,
    ``activity_visibility``), each ``everyone``, ``contacts``, ``close_friends`` or ``nobody``
    (a :class:`~presence.domain.Visibility` too); the others are left as they are. True if
    anything changed.

    Saved as the settings page saves it: only the levels given that differ from the stored ones
    are written, and a user without a row (following the site's ``DEFAULT_PRIVACY``) gets one
    only when a level differs from it. A row stores its levels: it does not follow a later
    change of ``DEFAULT_PRIVACY`` (there is no "site default" value). Open connections see the
    change after commit. Raises :class:`InvalidInput` (``invalid_value``: an unknown name or
    level; ``unknown_users``: an id of no user); nothing is saved then."""
    return run(call(_set_privacy, user, levels))


async def aset_privacy(user: Any, **levels: Any) -> bool:
    return await arun(call(_set_privacy, user, levels))


def set_invisible(user: Any, invisible: bool) -> bool:
    """Make the user look offline to everyone (``True``) or not (``False``), keeping their
    status as it is: do not disturb, and the custom status text, emoji, activity and when they
    clear (``set_status(user, "invisible")`` sets the whole status, so it clears them). True
    if that changed anything.

    Saves ``PrivacySettings.invisible`` through the model, as the admin does: open connections
    see the change after commit, and Redis's copy (the online count, the ledger's signals)
    follows it. A user without a row is visible; going invisible makes one, with the site's
    ``DEFAULT_PRIVACY`` levels. Raises :class:`InvalidInput` (``invalid_value``: not a bool;
    ``unknown_users``: an id of no user); nothing is saved then."""
    return run(call(_set_invisible, user, invisible))


async def aset_invisible(user: Any, invisible: bool) -> bool:
    return await arun(call(_set_invisible, user, invisible))
