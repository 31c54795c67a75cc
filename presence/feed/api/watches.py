"""Live watches asked again: ``recheck_watches`` has every process with connections of these
users ask ``PRESENCE_FEED["CAN_READ"]`` again for the timelines they watch (presence.feed.live
answers it), as ``presence.api.recheck_room`` does for rooms. The feed calls it itself after its
own changes that can take a timeline away (presence.feed.receivers); a site calls it after a
change of its own rule's facts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from presence import extensions
from presence.users import encode_id, user_pk

#: the hub topic kind of live timelines (presence.feed.live's topics)
WATCH_KIND = "feed"


def recheck_payload(users: Iterable[Any] | None, feeds: Iterable[str] | None) -> dict[str, Any]:
    """What a recheck announces: ``{"recheck": [ids] | None, "feeds": [names] | None}``
    (None: every watcher, every timeline)."""
    ids = None if users is None else list(dict.fromkeys(encode_id(user_pk(u)) for u in users))
    return {"recheck": ids, "feeds": None if feeds is None else sorted(set(feeds))}


def announce_recheck(users: Iterable[Any] | None, feeds: Iterable[str] | None = None) -> None:
    """:func:`recheck_watches` for several users at once (the feed's own receivers)."""
    # Sent again if the layer fails it: a refusal is still due a while later; a repeat only asks
    # the rule once more.
    extensions.announce_to_topic(WATCH_KIND, recheck_payload(users, feeds), retry=True)


def recheck_watches(user: Any | None, feeds: Iterable[str] | None = None) -> None:
    """Ask the site's ``CAN_READ`` rule again, now, for the timelines ``user`` (a user or an id;
    None: every watcher) watches live over the WebSocket (``feeds``: only these names, e.g.
    ``["group:algebra"]``; None: all of them), in every process with such connections. Each
    connection refused a timeline stops watching it and is sent ``unknown_feed`` naming it, as
    a refused ``watch_feed`` is. Call it after a change that may take a timeline away (the
    site's own rule's facts); the feed calls it itself when a membership ends, a group is
    deleted or renamed, and a contact or block changes. Never raises for the layer (a failed
    send is logged, and sent again)."""
    announce_recheck(None if user is None else [user], feeds)


async def arecheck_watches(user: Any | None, feeds: Iterable[str] | None = None) -> None:
    """:func:`recheck_watches` for async code."""
    users = None if user is None else [user]
    await extensions.aannounce_to_topic(WATCH_KIND, recheck_payload(users, feeds), retry=True)
