"""Per-person exceptions to a privacy level, as messengers have them: "always share with" and
"never share with" (:class:`presence.models.PrivacyException`). Each write is an
operation of one database call, run as the contacts' are (presence.api._contacts)."""

from __future__ import annotations

from typing import Any

from presence.api._contacts import _two_users
from presence.domain import VISIBILITY_SETTINGS, InvalidInput
from presence.models import PrivacyException
from presence.operations import arun, call, run
from presence.users import user_pk as _pk


def _check_setting(setting: Any) -> str:
    if setting not in VISIBILITY_SETTINGS:
        raise InvalidInput(
            "invalid_value",
            f"setting must be one of {', '.join(VISIBILITY_SETTINGS)}; got {setting!r}.",
        )
    return str(setting)


def _share_with(owner: Any, viewer: Any, setting: str, allow: bool) -> bool:
    setting = _check_setting(setting)
    if not isinstance(allow, bool):
        raise InvalidInput("invalid_value", f"allow must be True or False; got {allow!r}.")
    owner_pk, viewer_pk = _two_users(owner, viewer, "share with")
    row, created = PrivacyException.objects.get_or_create(
        owner_id=owner_pk, viewer_id=viewer_pk, setting=setting, defaults={"allow": allow}
    )
    if created or row.allow == allow:
        return created
    row.allow = allow
    row.save(update_fields=["allow"])
    return True


def _unshare(owner: Any, viewer: Any, setting: str) -> bool:
    setting = _check_setting(setting)
    # A queryset delete sends post_delete for each row (presence listens to it).
    deleted, _ = PrivacyException.objects.filter(
        owner_id=_pk(owner), viewer_id=_pk(viewer), setting=setting
    ).delete()
    return deleted > 0


def share_with(owner: Any, viewer: Any, setting: str, allow: bool = True) -> bool:
    """``owner`` always (``allow``) or never (``allow=False``) shares ``setting`` (one of
    ``online_visibility``, ``last_seen_visibility``, ``activity_visibility``) with ``viewer``,
    whatever its level. True if that changed anything.

    A block still hides everything, and ``invisible`` still beats an "always share". Saves the
    row like the admin does, so open connections see the change after commit. Raises
    :class:`InvalidInput` (``invalid_value``: an unknown setting, ``allow`` not a bool, or the
    owner as viewer; ``unknown_users``: an id of no user); nothing changes then."""
    return run(call(_share_with, owner, viewer, setting, allow))


async def ashare_with(owner: Any, viewer: Any, setting: str, allow: bool = True) -> bool:
    return await arun(call(_share_with, owner, viewer, setting, allow))


def unshare(owner: Any, viewer: Any, setting: str) -> bool:
    """Remove ``owner``'s exception of ``setting`` for ``viewer`` (the level applies again).
    True if there was one."""
    return run(call(_unshare, owner, viewer, setting))


async def aunshare(owner: Any, viewer: Any, setting: str) -> bool:
    return await arun(call(_unshare, owner, viewer, setting))
