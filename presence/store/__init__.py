"""The one Redis store: a key scheme, Lua scripts, plans, clients and one failure policy.

A store operation is a plan, built and then run: ``store.run(store.plans.touch(user_id, device,
now))`` (``await store.arun(...)`` on an event loop). The store (:class:`PresenceStore`) holds its
key scheme (``store.keys``), its plans (``store.plans``), its clients and the health of Redis.

- :mod:`presence.store.keys` -- where things live, and the score encoding;
- :mod:`presence.store.scripts` -- the Lua scripts (``lua/*.lua``) with their constants;
- :mod:`presence.store.plans` -- building plans (commands + parsing + fallback), no I/O, a
  package by concern (the plan type; recording, schedules, reads, scans, ...), composed as
  :class:`Plans`;
- :mod:`presence.store.client` -- the store: running plans (``run``/``arun``) on the clients
  of :mod:`presence.store.connecting`;
- :mod:`presence.store.cluster` -- running plans on a Redis Cluster: :mod:`~presence.store.rounds`
  (the rounds, written once), :mod:`~presence.store.pipelines` (each master's pipeline) and
  :mod:`~presence.store.nodes` (its clients and per-master health);
- :mod:`presence.store.health` -- outage tracking;
- :mod:`presence.store.redact` -- URLs without their credentials, for messages and logs.

The rest of presence uses :func:`get_store` and the names below. Layout: docs/redis-layout.md.
"""

from __future__ import annotations

import threading

from django.core.signals import setting_changed
from django.dispatch import receiver

from presence.conf import get_settings
from presence.store.client import REDIS_SCHEMES, PresenceStore, StoreUnavailable
from presence.store.connecting import primary_location, redis_location, redis_url_problem
from presence.store.health import Health
from presence.store.keys import (
    DEVICE_MASK_LIMIT,
    FLAG_CONNECTED,
    FLAG_IDLE,
    SCORE_FACTOR,
    KeyScheme,
    decode_score,
)
from presence.store.plans import (
    RAISE,
    ConnectionOp,
    Plan,
    Plans,
    Raise,
    StaleEntry,
    Transition,
    UserRecord,
    merge,
    merge_apart,
    script_call,
)
from presence.store.redact import redact_url
from presence.store.scripts import (
    CLAIM_DUE,
    CONNECTION,
    DESCRIBE_CONNECTIONS,
    READ_RECENT,
    REMOVE_IF_UNCHANGED,
    SIGN_OFF,
    TOUCH,
    Script,
)

__all__ = [
    "CLAIM_DUE",
    "CONNECTION",
    "DESCRIBE_CONNECTIONS",
    "DEVICE_MASK_LIMIT",
    "FLAG_CONNECTED",
    "FLAG_IDLE",
    "RAISE",
    "READ_RECENT",
    "REDIS_SCHEMES",
    "REMOVE_IF_UNCHANGED",
    "SCORE_FACTOR",
    "SIGN_OFF",
    "TOUCH",
    "ConnectionOp",
    "Health",
    "KeyScheme",
    "Plan",
    "Plans",
    "PresenceStore",
    "Raise",
    "Script",
    "StaleEntry",
    "StoreUnavailable",
    "Transition",
    "UserRecord",
    "decode_score",
    "get_store",
    "is_current",
    "merge",
    "merge_apart",
    "primary_location",
    "redact_url",
    "redis_location",
    "redis_url_problem",
    "reset_clients",
    "script_call",
]

_store: PresenceStore | None = None
_store_lock = threading.Lock()


def get_store() -> PresenceStore:
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                _store = PresenceStore(get_settings())
    return _store


def is_current(store: PresenceStore) -> bool:
    """Whether ``store`` is still the one :func:`get_store` answers (not reset since)."""
    return _store is store


def reset_clients() -> None:
    """Forget clients and cached settings (called when PRESENCE or CACHES change)."""
    global _store
    with _store_lock:
        # Forgotten before it is closed: a user of it that fails as it closes (the closes
        # listener's thread) sees it is no longer current, and stays quiet.
        old, _store = _store, None
        if old is not None:
            old.close()


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: object) -> None:
    # The store is built from PRESENCE and CACHES (override_settings in tests).
    if setting in {"PRESENCE", "CACHES"}:
        reset_clients()
