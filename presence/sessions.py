"""Are the credentials a WebSocket was opened with still valid? (logout, password change,
deactivation, token expiry)

A socket authenticates once, at its handshake, with a Django session or a token
(:mod:`presence.tokens`); these checks let it end with its credentials. Session keys never leave
this module in the clear: the live layer sends digests of them, and nothing here logs one.

Logouts and password changes are announced to the sockets' processes (``presence.announce``),
and also marked in Redis for a short while (:func:`mark_session_ended_plan`,
:func:`mark_account_changed_plan`): a socket whose handshake read its session just before such an
announcement, and whose process joined the user's account group just after it, reads the marks
once it has joined (:func:`recent_ends_plan`) and closes all the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.core import signing
from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.crypto import constant_time_compare, salted_hmac

from presence.conf import get_settings
from presence.store import Plan, PresenceStore
from presence.users import UserId, encode_id

#: the ASGI scope key where presence.tokens.TokenAuthMiddleware keeps the token it
#: authenticated the connection with (the consumer re-checks it, as it re-checks sessions)
SCOPE_TOKEN = "presence.token"

_TOKEN_SALT = "presence.tokens"


def session_key_of(scope: dict[str, Any]) -> str | None:
    """The key of the session a connection's scope carries (channels' SessionMiddleware), if any."""
    session = scope.get("session")
    if session is None:
        return None
    key = getattr(session, "session_key", None)
    return str(key) if key else None


def session_digest(session_key: str) -> str:
    """A keyed digest that names a session in channel-layer messages without revealing it."""
    return salted_hmac("presence.sessions", session_key, algorithm="sha256").hexdigest()


def session_is_valid(session_key: str, user_id: Any) -> bool:
    """Whether the session still exists, still logs in ``user_id`` (an active user, through a
    configured backend) and carries the user's current auth hash, as Django checks on every
    request. Read-only: unlike ``django.contrib.auth.get_user`` it neither flushes nor cycles
    the session, which the browser still uses."""
    return not invalid_among([(Credential(session_key=session_key), user_id)])[0]


#: keys or ids per query of a bulk check (SQLite's limit on a statement's parameters)
_CHUNK = 900


def _chunks(values: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


def _session_data(keys: set[str]) -> dict[str, dict[str, Any]]:
    """The data of these sessions that still exist: database sessions in one query (per
    _CHUNK keys), other engines (signed cookies, cache, files) each read as Django reads them."""
    from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore

    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    if not issubclass(store_class, DatabaseSessionStore):
        return {key: store_class(key).load() for key in keys}
    # The database is the sessions' own record (cached_db's cache only copies it).
    model = store_class.get_model_class()
    decoder = store_class()
    now = timezone.now()
    data: dict[str, dict[str, Any]] = {}
    for chunk in _chunks(sorted(keys)):
        rows = model.objects.filter(session_key__in=chunk, expire_date__gt=now)
        for key, encoded in rows.values_list("session_key", "session_data"):
            data[key] = decoder.decode(encoded)
    return data


def _users(pks: set[Any]) -> dict[Any, Any]:
    UserModel = get_user_model()
    found: dict[Any, Any] = {}
    for chunk in _chunks(list(pks)):
        found.update((user.pk, user) for user in UserModel._default_manager.filter(pk__in=chunk))
    return found


def _token_claim(token: str) -> tuple[Any, str] | None:
    """The user pk and password mark a token carries, if it is good and not expired."""
    try:
        data = signing.loads(token, salt=_TOKEN_SALT, max_age=get_settings().TOKEN_MAX_AGE)
    except signing.BadSignature:  # also SignatureExpired
        return None
    pk = data.get("u") if isinstance(data, dict) else None
    if not isinstance(pk, str):
        return None
    try:
        return get_user_model()._meta.pk.to_python(pk), str(data.get("p"))
    except ValidationError:
        return None


def _session_claim(data: dict[str, Any]) -> tuple[Any, str] | None:
    """The user pk and backend a session logs in, if any through a configured backend."""
    try:
        stored_id = get_user_model()._meta.pk.to_python(data[SESSION_KEY])
        backend_path = data[BACKEND_SESSION_KEY]
    except (KeyError, ValueError, TypeError, ValidationError):
        return None
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    return stored_id, backend_path


def _loads_by_model(backend: Any) -> bool:
    # ModelBackend's get_user is "the active user of that pk": read in bulk. Any other
    # backend's get_user is asked user by user. (Imported here: it needs the apps loaded.)
    from django.contrib.auth.backends import ModelBackend

    return isinstance(backend, ModelBackend) and type(backend).get_user is ModelBackend.get_user


def invalid_among(checks: Sequence[tuple[Credential, Any]]) -> list[bool]:
    """For each (credential, user id): whether it no longer authenticates that user (a session
    logged out, expired or of another password; a token expired, of another password; the user
    deactivated or deleted). The same rules as :func:`session_is_valid` and
    :func:`user_for_token`, for a whole process's sockets in a few queries whatever their
    number: the database sessions in one, the users in one (per 900 of each)."""
    sessions = _session_data(
        {c.session_key for c, _ in checks if c.token is None and c.session_key}
    )
    claims: list[tuple[Any, str] | None] = []
    in_bulk: set[Any] = set()
    for credential, _ in checks:
        if credential.token is not None:
            claim = _token_claim(credential.token)
            via_model = True
        else:
            data = sessions.get(credential.session_key or "")
            claim = None if data is None else _session_claim(data)
            via_model = claim is not None and _loads_by_model(load_backend(claim[1]))
        claims.append(claim)
        if claim is not None and via_model:
            in_bulk.add(claim[0])
    users = _users(in_bulk) if in_bulk else {}
    invalid: list[bool] = []
    for (credential, user_id), claim in zip(checks, claims, strict=True):
        if claim is None or claim[0] != user_id:
            invalid.append(True)
        elif credential.token is not None:
            user = users.get(claim[0])
            valid = user is not None and getattr(user, "is_active", True)
            invalid.append(not (valid and claim[1] == password_mark(user)))
        else:
            data = sessions[credential.session_key or ""]
            invalid.append(not _session_holds(data, claim, users))
    return invalid


def _session_holds(data: dict[str, Any], claim: tuple[Any, str], users: dict[Any, Any]) -> bool:
    stored_id, backend_path = claim
    backend: Any = load_backend(backend_path)
    if _loads_by_model(backend):
        user = users.get(stored_id)
        user = user if user is not None and backend.user_can_authenticate(user) else None
    else:
        user = backend.get_user(stored_id)
    if user is None or user.pk != stored_id:
        return False
    if not hasattr(user, "get_session_auth_hash"):
        return True
    stored_hash = data.get(HASH_SESSION_KEY)
    if not stored_hash:
        return False
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(stored_hash, current) for current in hashes)


# --- tokens (presence.tokens is their public face) -------------------------------------------


def password_mark(user: Any) -> str:
    """Changes with the password hash (and is no secret of it), so a new password ends tokens."""
    return salted_hmac(_TOKEN_SALT, user.password or "", algorithm="sha256").hexdigest()[:16]


def issue_token(user: Any) -> str:
    """A token that authenticates ``user`` for TOKEN_MAX_AGE seconds (until their password
    changes)."""
    return signing.dumps({"u": str(user.pk), "p": password_mark(user)}, salt=_TOKEN_SALT)


def user_for_token(token: str) -> Any | None:
    """The active user ``token`` authenticates, or None (bad, expired, password changed)."""
    claim = _token_claim(token)
    if claim is None:
        return None
    user = get_user_model()._default_manager.filter(pk=claim[0]).first()
    if user is None or not getattr(user, "is_active", True):
        return None
    return user if claim[1] == password_mark(user) else None


# --- how a socket authenticated ----------------------------------------------------------------


@dataclass(frozen=True)
class Credential:
    """What a socket authenticated with: a session (``session_key``) or a token (``token``)."""

    session_key: str | None = None
    token: str | None = None

    @cached_property
    def session_digest(self) -> str | None:
        """Names the session in logout announcements; None for a token."""
        return session_digest(self.session_key) if self.session_key else None

    def is_valid(self, user_id: Any) -> bool:
        """Whether it still authenticates ``user_id`` (database reads; many credentials at
        once: :func:`invalid_among`)."""
        return not invalid_among([(self, user_id)])[0]


def credential_of(scope: dict[str, Any]) -> Credential | None:
    """How the scope's user authenticated: the token presence's TokenAuthMiddleware accepted
    (even beside a session cookie, which then belongs to nobody), else the scope's session;
    None when neither (another authentication middleware: such sockets are not re-checked)."""
    token = scope.get(SCOPE_TOKEN)
    if isinstance(token, str):
        return Credential(token=token)
    key = session_key_of(scope)
    return Credential(session_key=key) if key else None


# --- marks of recent logouts and password changes (see the module's docstring) ----------------


def _mark_ttl() -> int:
    # Long enough for any handshake to reach its account group; past it the periodic check
    # (SESSION_CHECK_INTERVAL) would have caught the socket anyway.
    conf = get_settings()
    return 2 * max(conf.SESSION_CHECK_INTERVAL, conf.CONNECTION_TTL)


def _ended_key(store: PresenceStore, user_id: UserId, digest: str) -> str:
    return f"{store.conf.KEY_PREFIX}:ended-session:{encode_id(user_id)}:{digest}"


def _changed_key(store: PresenceStore, user_id: UserId) -> str:
    return f"{store.conf.KEY_PREFIX}:account-changed:{encode_id(user_id)}"


def mark_session_ended_plan(store: PresenceStore, user_id: UserId, digest: str) -> Plan[None]:
    """Mark a logged-out session of ``user_id`` (by digest) for a while."""
    return Plan(
        commands=[("SET", _ended_key(store, user_id, digest), 1, "EX", _mark_ttl())],
        parse=lambda replies: None,
        fallback=None,
    )


def mark_account_changed_plan(store: PresenceStore, user_id: UserId) -> Plan[None]:
    """Mark a user whose password changed or who was deactivated, for a while."""
    return Plan(
        commands=[("SET", _changed_key(store, user_id), 1, "EX", _mark_ttl())],
        parse=lambda replies: None,
        fallback=None,
    )


def recent_ends_plan(
    store: PresenceStore, user_id: UserId, credential: Credential
) -> Plan[tuple[bool, bool]]:
    """Whether this credential's session was logged out lately, and whether the user's password
    changed (or the user was deactivated) lately. (False, False) when Redis is unavailable: the
    periodic check still comes."""
    digest = credential.session_digest
    commands: list[tuple[Any, ...]] = [("EXISTS", _changed_key(store, user_id))]
    if digest is not None:
        commands.append(("EXISTS", _ended_key(store, user_id, digest)))
    return Plan(
        commands=commands,
        parse=lambda replies: (len(replies) > 1 and bool(replies[1]), bool(replies[0])),
        fallback=(False, False),
    )
