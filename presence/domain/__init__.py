"""The rules of presence, free of I/O: statuses, device aggregation, privacy, humanized times.

Everything that decides what a viewer may see lives here, in :func:`resolve`; the store reports
facts, the relations loader reports who is whose contact, and every read path (Python API,
template tags, JSON endpoint, WebSocket) hands both to :func:`resolve`.

By concern:

- :mod:`~presence.domain.model`: statuses, devices, what Redis and the database report
  (:class:`LiveState`, :class:`Choices`), relations and the :class:`Presence` a viewer is shown;
- :mod:`~presence.domain.resolver`: :func:`permits`, :func:`live_status` and :func:`resolve`,
  the one privacy resolver;
- :mod:`~presence.domain.changes`: the kinds of a change and who can see it
  (:meth:`Change.seen_by`);
- :mod:`~presence.domain.display`: :func:`humanize`;
- :mod:`~presence.domain.clock`: :func:`passed`, a wait a clock stepped back cannot stretch;
- :mod:`~presence.domain.validation`: :func:`check_text` and :func:`parse_status_change`;
- :mod:`~presence.domain.protocol`: the client's WebSocket frames, :func:`parse_frame`.

Everything is importable from ``presence.domain`` itself, as it always was.
"""

from __future__ import annotations

from presence.domain.changes import (
    ACTIVITY_CHANGE,
    ALL_KINDS,
    ANY_CHANGE,
    LEVELS,
    LIVE_CHANGE,
    RULES_CHANGE,
    Change,
    Kind,
    add_change,
    levels_change,
    relation_change,
)
from presence.domain.clock import passed
from presence.domain.display import TIME_STRINGS, humanize
from presence.domain.model import (
    DEVICE_BITS,
    DEVICE_MASK_LIMIT,
    EXCEPTION_ALLOW,
    EXCEPTION_BITS,
    EXCEPTION_DENY,
    EXCEPTION_SHIFT,
    HIDDEN,
    LAST_SEEN_APPROX_LABELS,
    SELF,
    STATUS_LABELS,
    STRANGER,
    VISIBILITY_LABELS,
    VISIBILITY_SETTINGS,
    Choices,
    Device,
    LastSeenApprox,
    LiveState,
    Presence,
    Relation,
    Status,
    StatusChoice,
    Timing,
    UserId,
    Visibility,
    default_choices,
    device_from_user_agent,
    devices_from_mask,
    exception_bits,
    iso_time,
)
from presence.domain.protocol import (
    CLIENT_TYPES,
    MAX_USER_ID,
    MAX_USER_ID_LENGTH,
    ClientMessage,
    Extension,
    Heartbeat,
    HeartbeatState,
    SetStatus,
    Subscribe,
    Unsubscribe,
    UnwatchCount,
    WatchCount,
    parse_frame,
    parse_subscription_query,
)
from presence.domain.resolver import (
    DAY,
    SECOND,
    approximate,
    approximate_before_today,
    approximate_from,
    carry_last_seen,
    live_news,
    live_status,
    offline_at,
    permits,
    resolve,
    shows_last_seen,
    visibly_differs,
)
from presence.domain.validation import (
    ALLOWED_FORMAT_CHARACTERS,
    InvalidInput,
    Limits,
    StatusChange,
    check_text,
    parse_status_change,
)

__all__ = [
    "ACTIVITY_CHANGE",
    "ALLOWED_FORMAT_CHARACTERS",
    "ALL_KINDS",
    "ANY_CHANGE",
    "CLIENT_TYPES",
    "DAY",
    "DEVICE_BITS",
    "DEVICE_MASK_LIMIT",
    "EXCEPTION_ALLOW",
    "EXCEPTION_BITS",
    "EXCEPTION_DENY",
    "EXCEPTION_SHIFT",
    "HIDDEN",
    "LAST_SEEN_APPROX_LABELS",
    "LEVELS",
    "LIVE_CHANGE",
    "MAX_USER_ID",
    "MAX_USER_ID_LENGTH",
    "RULES_CHANGE",
    "SECOND",
    "SELF",
    "STATUS_LABELS",
    "STRANGER",
    "TIME_STRINGS",
    "VISIBILITY_LABELS",
    "VISIBILITY_SETTINGS",
    "Change",
    "Choices",
    "ClientMessage",
    "Device",
    "Extension",
    "Heartbeat",
    "HeartbeatState",
    "InvalidInput",
    "Kind",
    "LastSeenApprox",
    "Limits",
    "LiveState",
    "Presence",
    "Relation",
    "SetStatus",
    "Status",
    "StatusChange",
    "StatusChoice",
    "Subscribe",
    "Timing",
    "Unsubscribe",
    "UnwatchCount",
    "UserId",
    "Visibility",
    "WatchCount",
    "add_change",
    "approximate",
    "approximate_before_today",
    "approximate_from",
    "carry_last_seen",
    "check_text",
    "default_choices",
    "device_from_user_agent",
    "devices_from_mask",
    "exception_bits",
    "humanize",
    "iso_time",
    "levels_change",
    "live_news",
    "live_status",
    "offline_at",
    "parse_frame",
    "parse_status_change",
    "parse_subscription_query",
    "passed",
    "permits",
    "relation_change",
    "resolve",
    "shows_last_seen",
    "visibly_differs",
]
