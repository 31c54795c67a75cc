"""System checks on the site's database as presence uses it. Ids are stable; each has a hint."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register

#: what a SQLite database served under an ASGI server needs (docs/deployment.md)
SQLITE_OPTIONS: dict[str, Any] = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL;",
}


def suggested_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with what :func:`sqlite_gaps` asks for added (the site's own kept)."""
    suggested = {"timeout": SQLITE_OPTIONS["timeout"], **options}
    suggested["transaction_mode"] = SQLITE_OPTIONS["transaction_mode"]
    init_command = str(options.get("init_command") or "").strip()
    if "journal_mode=wal" not in init_command.lower().replace(" ", ""):
        head = init_command.rstrip(";") + "; " if init_command else ""
        suggested["init_command"] = head + SQLITE_OPTIONS["init_command"]
    return suggested


def _in_memory(name: Any) -> bool:
    text = str(name or "")
    return text in {"", ":memory:"} or "mode=memory" in text


def sqlite_gaps(database: dict[str, Any]) -> list[str]:
    """What a SQLite database's OPTIONS lack to share writes between processes and threads
    (empty for another engine, or an in-memory database)."""
    engine = str(database.get("ENGINE", ""))
    if not engine.endswith(("sqlite3", "spatialite")) or _in_memory(database.get("NAME")):
        return []
    options = database.get("OPTIONS") or {}
    gaps = []
    if "timeout" not in options:
        gaps.append("a busy 'timeout'")
    if str(options.get("transaction_mode") or "").upper() != "IMMEDIATE":
        gaps.append("'transaction_mode': 'IMMEDIATE'")
    init_command = str(options.get("init_command") or "").lower().replace(" ", "")
    if "journal_mode=wal" not in init_command:
        gaps.append("'PRAGMA journal_mode=WAL' in 'init_command'")
    return gaps


@register(Tags.compatibility)
def check_sqlite_under_asgi(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """presence.W005 for the site's settings (see :func:`sqlite_warnings`)."""
    databases = getattr(settings, "DATABASES", {})
    return sqlite_warnings(getattr(settings, "ASGI_APPLICATION", None), databases.get("default"))


def sqlite_warnings(asgi_application: Any, database: dict[str, Any] | None) -> list[CheckMessage]:
    """presence.W005: under an ASGI server, presence writes to the database beside the site's
    requests (the sweep persists last seen, sockets save statuses); SQLite with Django's
    defaults answers a request's read-then-write transaction (``update_or_create``) with
    "database is locked" at once whenever another write holds the lock."""
    gaps = sqlite_gaps(database or {}) if asgi_application else []
    if not gaps:
        return []
    suggested = suggested_options(dict((database or {}).get("OPTIONS") or {}))
    return [
        Warning(
            "The default database is SQLite under an ASGI server without "
            + ", ".join(gaps)
            + ": writes made beside a request (presence's sweep persisting last seen, a "
            "socket's status) can make the request fail with 'database is locked'.",
            hint=f"Set DATABASES['default']['OPTIONS'] = {suggested!r} (Django's SQLite notes; "
            "see presence's deployment docs, 'SQLite under an ASGI server'), or use PostgreSQL.",
            id="presence.W005",
        )
    ]
