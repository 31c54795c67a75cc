"""User ids as tests spell them, whatever the user model's pk (the main suite runs with integer
pks; `make test` runs part of it again with UUID pks, tests/settings/uuid.py)."""

from __future__ import annotations

import uuid
from typing import Any

from presence import users


def wire_id(user_or_pk: Any) -> int | str:
    """A user's id as a client sends it: an integer as a JSON number, a UUID as its text."""
    pk = getattr(user_or_pk, "pk", user_or_pk)
    return pk if isinstance(pk, int) else str(pk)


def missing_id(n: int = 0) -> Any:
    """An id of the site's pk type that names no user (none of the tests' users)."""
    kind = users.pk_kind()
    if kind == "int":
        return 999_000 + n
    if kind == "uuid":
        return uuid.UUID(int=0xDEAD_0000 + n)
    return f"nobody-{n}"


def uid(n: int) -> Any:
    """The n-th id of the site's pk type, for store tests that need no database user: ``n``
    itself with integer pks, a UUID made of ``n`` with UUID pks; ordered as ``n`` is."""
    kind = users.pk_kind()
    if kind == "int":
        return n
    if kind == "uuid":
        return uuid.UUID(int=n)
    return f"user-{n:06d}"


def member(n: int) -> str:
    """How Redis spells :func:`uid` ``(n)`` (a sorted set's member, a hash field's prefix)."""
    return str(users.encode_id(uid(n)))


def redis_member(user_or_pk: Any) -> str:
    """A user's member in presence's sorted sets (the canonical form, presence.users)."""
    return str(users.encode_id(getattr(user_or_pk, "pk", user_or_pk)))
