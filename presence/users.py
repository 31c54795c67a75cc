"""Users as presence sees them: a user object or its id, always reduced to the primary key here.

Every module that takes "a user or a user id" (the API, the lifecycle, relations, privacy,
rendering, the feed) uses these functions, so the accepted inputs and the error messages are
the same everywhere.

The primary key may be an integer, a UUID or a string (docs/settings.md, "The user model"). In
Python a user id is always the pk's own type (``int``, ``uuid.UUID``, ``str``), as the database
returns it. Outside Python (Redis members, channel-layer messages) it has one canonical form,
:func:`encode_id`, and :func:`decode_id` reads it back; ids from clients (the JSON endpoint,
WebSocket frames) are read with :func:`parse_user_id`.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from typing import Any, Literal

from django.core.signals import setting_changed
from django.dispatch import receiver

from presence import domain
from presence.domain import MAX_USER_ID, UserId

__all__ = ["UserId", "decode_id", "encode_id", "parse_user_id", "user_pk", "viewer_pk"]

#: how presence stores and reads the site's pk: an integer, a UUID or a string
PkKind = Literal["int", "uuid", "str"]

#: longest integer id accepted as a string (BigAutoField ids have at most 19 digits)
MAX_INT_DIGITS = 19
#: longest string id a client may send: longer ones are refused before any lookup
MAX_ID_LENGTH = domain.MAX_USER_ID_LENGTH


# user_pk and viewer_pk return Any, not UserId: their results go into queryset lookups, which
# django-stubs checks against the user model mypy runs with (an integer pk), not the site's.


def user_pk(user_or_id: Any) -> Any:
    """The primary key (a :data:`UserId`) of a saved user, or the id given (a UUID's or a string
    pk's text as the pk). A bool, an unsaved user or anything else raises TypeError."""
    if isinstance(user_or_id, bool):
        raise TypeError("Expected a user or a user id, got a bool.")
    if isinstance(user_or_id, int | uuid.UUID):
        return user_or_id
    if isinstance(user_or_id, str):
        return _str_id(user_or_id)
    pk = getattr(user_or_id, "pk", None)
    if pk is None:
        raise TypeError(f"Expected a saved user or a user id, got {user_or_id!r}.")
    return int(pk) if isinstance(pk, int) else pk


def viewer_pk(viewer: Any) -> Any:
    """The viewer's primary key (a :data:`UserId`), or None for a stranger: None, an anonymous
    user, anything not authenticated. A user id stands for that (authenticated) user."""
    is_id = isinstance(viewer, int | uuid.UUID | str) and not isinstance(viewer, bool)
    if not is_id and not getattr(viewer, "is_authenticated", False):
        return None
    return user_pk(viewer)


def _str_id(text: str) -> UserId:
    """A user id given as a string: the pk itself for string pks, a UUID's text for UUID pks."""
    kind = pk_kind()
    if kind == "str":
        return text
    if kind == "uuid":
        try:
            return uuid.UUID(text)
        except ValueError:
            pass
    raise TypeError(f"Expected a saved user or a user id, got {text!r}.")


# --- the kind of the site's primary key --------------------------------------------------------


def pk_field(model: Any = None) -> Any:
    """The concrete primary key field of the user model (a multi-table-inheritance user's pk is
    a one-to-one link to its parent's: followed to the end)."""
    from django.contrib import auth
    from django.db import models

    field: Any = (model or auth.get_user_model())._meta.pk
    while isinstance(field, models.ForeignKey):
        field = field.target_field
    return field


def kind_of(field: Any) -> PkKind | None:
    """How presence handles a pk field; None for a pk it cannot key by (a composite key, a
    date, bytes, ...)."""
    from django.db import models

    if isinstance(field, models.AutoField | models.BigAutoField | models.SmallAutoField):
        return "int"
    if isinstance(field, models.IntegerField):  # Big/Small/Positive... subclass it
        return "int"
    if isinstance(field, models.UUIDField):
        return "uuid"
    if isinstance(field, models.CharField | models.TextField):  # Slug, Email, ...
        return "str"
    return None


#: the kind, once looked up (every reply of Redis naming users is decoded by kind, and looking
#: the model up costs more than parsing a room's join); forgotten when AUTH_USER_MODEL changes
_kind: PkKind | None = None


def pk_kind() -> PkKind:
    """The kind of the site's user pk (presence.E008 refuses a site where it has none)."""
    global _kind
    if _kind is None:
        _kind = kind_of(pk_field()) or "str"
    return _kind


@receiver(setting_changed)
def _forget_kind(*, setting: str, **kwargs: object) -> None:
    global _kind
    if setting == "AUTH_USER_MODEL":
        _kind = None


# --- the canonical form: Redis members, channel-layer messages ---------------------------------
# A string id may hold ":" (the separator of connection fields and members, docs/redis-layout.md):
# it is escaped, with "%" itself, so that one user's members can never be a prefix of another's.


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace(":", "%3A") if "%" in text or ":" in text else text


def _unescape(text: str) -> str:
    return text.replace("%3A", ":").replace("%25", "%") if "%" in text else text


def encode_id(user_id: UserId) -> int | str:
    """The canonical form of a user id outside Python: an int as itself (Redis keeps it in its
    compact integer encoding), a UUID as its lowercase hyphenated string, a string escaped."""
    if isinstance(user_id, int):
        return user_id
    if isinstance(user_id, uuid.UUID):
        return str(user_id)
    return _escape(user_id)


def id_decoder(kind: PkKind | None = None) -> Callable[[Any], UserId]:
    """A reader of :func:`encode_id`'s form (from Redis: bytes or str; from a channel layer:
    int or str) back to the pk's type. One per batch: it looks the kind up once."""
    kind = kind or pk_kind()
    if kind == "int":
        return int
    if kind == "uuid":
        return lambda value: uuid.UUID(value.decode() if isinstance(value, bytes) else str(value))
    return lambda value: _unescape(value.decode() if isinstance(value, bytes) else str(value))


def decode_id(value: Any) -> UserId:
    return id_decoder()(value)


_GROUP_SAFE = re.compile(r"[a-zA-Z0-9\-_.]{1,40}")


def group_key(user_id: UserId) -> str:
    """The id as part of a channel-layer group name (only ``[a-zA-Z0-9-_.]``, under 100
    characters in all): ints and UUIDs as they are, other strings that fit as they are, the rest
    as a digest (two users sharing a group only costs a resolution: messages name the user)."""
    text = str(user_id)
    if isinstance(user_id, int | uuid.UUID) or _GROUP_SAFE.fullmatch(text):
        return text
    return "h-" + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


# --- ids from clients --------------------------------------------------------------------------


def parse_user_id(value: Any, kind: PkKind | None = None) -> UserId:
    """An id as a client spelt it (a JSON number or string, a query parameter) as the site's pk.
    ValueError for a value that cannot be one (a bool, a malformed UUID, ...); an id of the right
    shape that names no user is left to the lookup."""
    kind = kind or pk_kind()
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("not a number or a string")
    if isinstance(value, str) and not 0 < len(value) <= MAX_ID_LENGTH:
        raise ValueError("empty or too long")
    if kind == "int":
        return _parse_int(value)
    if kind == "uuid":
        if not isinstance(value, str):
            raise ValueError("a UUID is a string")
        return uuid.UUID(value)  # ValueError when malformed
    return str(value)


def _parse_int(value: int | str) -> int:
    if isinstance(value, str):
        # isascii(): str.isdigit() also accepts "²" and other digits int() refuses.
        if not (value.isascii() and value.isdigit()) or len(value) > MAX_INT_DIGITS:
            raise ValueError("not an integer")
        value = int(value)
    if not 0 <= value <= MAX_USER_ID:
        raise ValueError("out of range")
    return value
