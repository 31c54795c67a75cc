"""Users as presence sees them: a user object or its id, always reduced to the primary key here.

Every module that takes "a user or a user id" (the API, the lifecycle, relations, privacy,
rendering, the feed) uses these two functions, so the accepted inputs and the error messages are
the same everywhere.
"""

from __future__ import annotations

from typing import Any


def user_pk(user_or_id: Any) -> int:
    """The primary key of a saved user, or the id given. A bool, an unsaved user or anything
    else raises TypeError."""
    if isinstance(user_or_id, bool):
        raise TypeError("Expected a user or a user id, got a bool.")
    if isinstance(user_or_id, int):
        return user_or_id
    pk = getattr(user_or_id, "pk", None)
    if pk is None:
        raise TypeError(f"Expected a saved user or a user id, got {user_or_id!r}.")
    return int(pk)


def viewer_pk(viewer: Any) -> int | None:
    """The viewer's primary key, or None for a stranger: None, an anonymous user, anything not
    authenticated. A user id stands for that (authenticated) user."""
    if isinstance(viewer, int) and not isinstance(viewer, bool):
        return viewer
    if viewer is None or not getattr(viewer, "is_authenticated", False):
        return None
    return int(viewer.pk)
