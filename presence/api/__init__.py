"""The public Python API: record activity, read presence as a viewer may see it, choose a
status, follow/unfollow/close friends/block for a site's own graph, notify after bulk writes,
clean up.

Every function has an async twin prefixed ``a`` (``touch``/``atouch``, ``get_presence``/
``aget_presence``, ...) except :func:`cleanup` (a batch job for ``manage.py presence_cleanup``
and cron, not for request paths) and the package's own sync helpers ``recent_online_count``,
``watched_friends`` and ``display_name`` (docs/api.md). :func:`apply_change`/
:func:`aapply_change` is the step ``set_status`` shares with the status endpoint and the
WebSocket (sites use ``set_status``/``aset_status``). Targets and viewers are users or user
ids; an anonymous viewer (``None`` or ``AnonymousUser``) is a stranger.

Each operation is written once, as a generator of steps (:mod:`presence.operations`), and both
twins run it: the sync one in the caller's thread, the async one on its event loop. The
sections live in private modules: ``_recording``, ``_reading``, ``_status`` (the status, do
not disturb alone), ``_privacy`` (levels, invisible), ``_contacts``, ``_sharing`` (always/never
share with), ``_maintenance``;
rooms and member cards are :mod:`presence.rooms`'s. The live connections' side (opening,
heartbeats, sweeps, the hub's reads) is :mod:`presence.lifecycle`.
"""

from __future__ import annotations

from presence.api._contacts import (
    ablock,
    afollow,
    anotify_changed,
    aset_close_friend,
    aunblock,
    aunfollow,
    block,
    follow,
    notify_changed,
    set_close_friend,
    unblock,
    unfollow,
)
from presence.api._counting import (
    anote_invisible,
    aonline_count,
    note_invisible,
    online_count,
    recent_online_count,
)
from presence.api._export import aexport_user_data, export_user_data
from presence.api._guests import aguest_count, guest_count
from presence.api._maintenance import CleanupIncomplete, CleanupReport, cleanup
from presence.api._privacy import aset_invisible, aset_privacy, set_invisible, set_privacy
from presence.api._reading import (
    abulk_presence,
    aget_presence,
    aonline_among,
    aonline_friends,
    aonline_friends_with_presence,
    aonline_now,
    bulk_presence,
    get_presence,
    online_among,
    online_friends,
    online_friends_with_presence,
    online_now,
    watched_friends,
)
from presence.api._recording import asign_off, atouch, sign_off, touch
from presence.api._sharing import ashare_with, aunshare, share_with, unshare
from presence.api._status import (
    aapply_change,
    apply_change,
    aset_dnd,
    aset_status,
    set_dnd,
    set_status,
)
from presence.domain import InvalidInput, Presence
from presence.rooms import (
    UnknownRoom,
    amember_card,
    arecheck_room,
    aroom_counts,
    aroom_page,
    aroom_presence,
    awith_names,
    display_name,
    member_card,
    recheck_room,
    room_counts,
    room_page,
    room_presence,
    with_names,
)

__all__ = [
    "CleanupIncomplete",
    "CleanupReport",
    "InvalidInput",
    "Presence",
    "UnknownRoom",
    "aapply_change",
    "ablock",
    "abulk_presence",
    "aexport_user_data",
    "afollow",
    "aget_presence",
    "aguest_count",
    "amember_card",
    "anote_invisible",
    "anotify_changed",
    "aonline_among",
    "aonline_count",
    "aonline_friends",
    "aonline_friends_with_presence",
    "aonline_now",
    "apply_change",
    "arecheck_room",
    "aroom_counts",
    "aroom_page",
    "aroom_presence",
    "aset_close_friend",
    "aset_dnd",
    "aset_invisible",
    "aset_privacy",
    "aset_status",
    "ashare_with",
    "asign_off",
    "atouch",
    "aunblock",
    "aunfollow",
    "aunshare",
    "awith_names",
    "block",
    "bulk_presence",
    "cleanup",
    "display_name",
    "export_user_data",
    "follow",
    "get_presence",
    "guest_count",
    "member_card",
    "note_invisible",
    "notify_changed",
    "online_among",
    "online_count",
    "online_friends",
    "online_friends_with_presence",
    "online_now",
    "recent_online_count",
    "recheck_room",
    "room_counts",
    "room_page",
    "room_presence",
    "set_close_friend",
    "set_dnd",
    "set_invisible",
    "set_privacy",
    "set_status",
    "share_with",
    "sign_off",
    "touch",
    "unblock",
    "unfollow",
    "unshare",
    "watched_friends",
    "with_names",
]

# For presence's own modules above this one (the hub's live online count, the views' cache
# header, the guests middleware, the admin's true view): not part of the documented API.
from presence.api._counting import COUNT_INTERVAL, alive_online_count  # noqa: F401
from presence.api._guests import anote_guest, note_guest  # noqa: F401
from presence.api._reading import live_user_ids  # noqa: F401
