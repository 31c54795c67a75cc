"""Plans: the commands of one store operation, how to read their replies, and what to answer
when Redis is unavailable. Building a plan does no I/O; :mod:`presence.store.client` runs it
(one pipeline, one round trip) under the one failure policy.

By concern:

- :mod:`~presence.store.plans.plan`: the :class:`Plan` type, :func:`merge`,
  :func:`merge_apart` and :func:`script_call`;
- :mod:`~presence.store.plans.recording`: requests, sign-offs and connections
  (:class:`Transition`);
- :mod:`~presence.store.plans.schedules`: the due and expiring schedules;
- :mod:`~presence.store.plans.reads`: many users' live state in one round trip;
- :mod:`~presence.store.plans.scans`: whole buckets, for cleanup and "online now"
  (:class:`StaleEntry`);
- :mod:`~presence.store.plans.ledger`: the online ledger's count and its invisible users;
- :mod:`~presence.store.plans.rooms`: rooms (members, meta, their stay, the sweep);
- :mod:`~presence.store.plans.guests`: the guest count (COUNT_GUESTS);
- :mod:`~presence.store.plans.export`: what Redis holds about one user (data requests);
- :mod:`~presence.store.plans.changes`: when users' visible presence last changed (stamps).

:class:`Plans` composes them into one object, the store's ``plans``, over its key scheme:
``store.run(store.plans.touch(user_id, device, now))`` builds the plan, then runs it. Every name
is importable from ``presence.store.plans`` itself.
"""

from __future__ import annotations

from presence.store.plans.changes import ChangePlans
from presence.store.plans.export import ExportPlans, UserRecord
from presence.store.plans.guests import GuestPlans
from presence.store.plans.ledger import LedgerPlans
from presence.store.plans.plan import (
    RAISE,
    Plan,
    PlanArea,
    Raise,
    merge,
    merge_apart,
    script_call,
)
from presence.store.plans.reads import READ_RECENT_KEYS, ReadPlans
from presence.store.plans.recording import ConnectionOp, RecordingPlans, Transition
from presence.store.plans.rooms import (
    MemberEntry,
    Pruned,
    RoomPlans,
    RoomRead,
    RoomTransition,
    RoomWrite,
)
from presence.store.plans.scans import Removal, ScanPlans, StaleEntry
from presence.store.plans.schedules import SchedulePlans

__all__ = [
    "RAISE",
    "READ_RECENT_KEYS",
    "ConnectionOp",
    "MemberEntry",
    "Plan",
    "PlanArea",
    "Plans",
    "Pruned",
    "Raise",
    "Removal",
    "RoomRead",
    "RoomTransition",
    "RoomWrite",
    "StaleEntry",
    "Transition",
    "UserRecord",
    "merge",
    "merge_apart",
    "script_call",
]


class Plans(
    RecordingPlans,
    SchedulePlans,
    ReadPlans,
    ScanPlans,
    LedgerPlans,
    RoomPlans,
    GuestPlans,
    ExportPlans,
    ChangePlans,
):
    """Every plan of the store, over its key scheme: one object, an area's plans written once in
    the area's module (each area holds only the key scheme, so they compose side by side)."""
