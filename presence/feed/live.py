"""Live timelines over presence's WebSocket, through its extension points (presence.extensions).

Client frames ``{"type": "watch_feed", "feed": F}`` and ``{"type": "unwatch_feed", "feed": F}``
(F: ``following``, ``mentions``, ``user:<id>`` or ``group:<slug>``; at most MAX_FEEDS per
connection) give a connection the hub topic F of kind ``feed``; every error answering them
names the feed (``"feed"``, as the frame sent it, where it was a string). A posted activity is
announced once to the processes with such topics; each resolves, for all its viewers at once,
who sees it on which timeline with the feed's rules and privacy, and sends them
``{"type": "activity", "feeds": [...], "activity": ACTIVITY}``.

A ``watch_feed`` with ``"after": ID`` (the newest activity the page shows; 0: none) is answered
``{"type": "missed_activities", "feed": F, "activities": [...], "reload": bool}``: the
timeline's activities newer than it, oldest first, read as the timeline is read (its rules and
privacy), at most MISSED_LIMIT; with more, none and ``"reload": true`` (the page loads the
timeline again). What is posted while a page's socket is down is not lost so.

``recheck_watches`` (presence.feed.api.watches) reaches the same delivery: each process asks
``CAN_READ`` again for the named users' watched timelines, and a refused one is unwatched and
answered ``{"type": "error", "code": "unknown_feed", "feed": F, ...}`` unasked.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.utils.translation import gettext

from presence import extensions, users
from presence.domain import InvalidInput, UserId
from presence.feed import api
from presence.feed.api import watches

logger = logging.getLogger("presence")

#: the hub topic kind of live timelines
KIND = watches.WATCH_KIND
#: live timelines one connection may watch
MAX_FEEDS = 10
#: most activities a watch_feed's "after" is answered with (a page of the timelines); past it
#: the client is told to load the timeline again
MISSED_LIMIT = api.PAGE_SIZE
#: the largest activity id "after" may be (a 64-bit primary key)
_MAX_ID = 2**63 - 1

#: (matched whole: "$" would also match before a final line break, letting "following\n" in)
FEED_NAME = re.compile(r"(?:following|mentions|user:\S{1,255}|group:[-a-zA-Z0-9_]{1,100})")
#: an integer pk's timeline: no leading zero, at most 19 digits
_INT_USER_FEED = re.compile(r"user:[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class WatchFeed:
    """Live activities of one timeline (the activity feed): ``following``, ``mentions``,
    ``user:<id>`` or ``group:<slug>``."""

    feed: str
    #: the newest activity the page shows (0: none), to be sent what it missed; None: nothing
    after: int | None = None


@dataclass(frozen=True)
class UnwatchFeed:
    feed: str


def _feed(data: Mapping[str, Any]) -> str:
    feed = data.get("feed")
    if not isinstance(feed, str):
        raise InvalidInput(
            "invalid_message",
            gettext("'feed' must be a string: following, mentions, user:<id> or group:<slug>."),
        )
    if FEED_NAME.fullmatch(feed):
        if not feed.startswith("user:"):
            return feed
        # A user's timeline is named by the canonical text of the pk (a UUID in lowercase).
        with contextlib.suppress(ValueError):
            return _user_feed(feed)
    raise InvalidInput(
        "invalid_value",
        gettext("Unknown feed %(feed)s: use following, mentions, user:<id> or group:<slug>.")
        % {"feed": repr(feed)[:60]},
    )


def _user_feed(feed: str) -> str:
    kind = users.pk_kind()
    if kind == "int" and not _INT_USER_FEED.fullmatch(feed):
        raise ValueError(feed)
    return "user:" + api.feed_key(users.parse_user_id(feed[5:], kind))


def parse_watch(data: Mapping[str, Any]) -> WatchFeed:
    feed = _feed(data)
    after = data.get("after")
    if after is not None and (
        isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= _MAX_ID
    ):
        raise InvalidInput(
            "invalid_value",
            gettext("'after' must be the id of an activity (a whole number, 0 for none)."),
        )
    return WatchFeed(feed, after)


def parse_unwatch(data: Mapping[str, Any]) -> UnwatchFeed:
    return UnwatchFeed(_feed(data))


async def watch_feed(connection: Any, message: WatchFeed) -> None:
    feed = message.feed
    hub = connection.hub
    watched = hub.topics_of(connection, KIND)
    if feed in watched:
        # Asked again on every watch: a member removed from a private group who watches it
        # again (after: 0 reads the whole timeline) is refused and stops getting its posts.
        if not await sync_to_async(_readable)(connection.user, feed):
            await hub.leave_topic(connection, KIND, feed)
            raise _unknown_feed(feed)
        if message.after is not None:
            await _send_missed(connection, feed, message.after)
        return
    if len(watched) >= MAX_FEEDS:
        raise InvalidInput(
            "too_many_feeds",
            gettext("At most %(limit)d live timelines per connection.") % {"limit": MAX_FEEDS},
        )
    if not await sync_to_async(_readable)(connection.user, feed):
        raise _unknown_feed(feed)
    await hub.join_topic(connection, KIND, feed)
    if message.after is not None:
        # Read once the topic is joined: what is posted from now on comes live (maybe in both:
        # a client drops a repeat by its id), what was posted before is in the read.
        await _send_missed(connection, feed, message.after)


async def _send_missed(connection: Any, feed: str, after: int) -> None:
    activities, complete = await sync_to_async(_missed)(connection.user, feed, after)
    frame = {
        "type": "missed_activities",
        "feed": feed,
        "activities": activities,
        "reload": not complete,
    }

    async def send(connection: Any) -> None:
        if feed in connection.hub.topics_of(connection, KIND):  # not unwatched meanwhile
            await connection.send_json(frame)

    # Behind the activity frames queued for the connection before it, as they are sent.
    await connection.hub.send_in_order([connection], send, "missed activities")


def _missed(user: Any, feed: str, after: int) -> tuple[list[dict[str, Any]], bool]:
    activities, complete = api.activities_after(user, feed, after, MISSED_LIMIT)
    return [api.activity_as_dict(activity) for activity in activities], complete


def _unknown_feed(feed: str) -> InvalidInput:
    # A timeline the site's rule refuses is answered as one that does not exist: which private
    # groups (or users) exist is not told either.
    return InvalidInput("unknown_feed", gettext("No such timeline: %(feed)s.") % {"feed": feed})


def _readable(user: Any, feed: str) -> bool:
    """Whether ``feed`` exists and ``user`` may read it (PRESENCE_FEED["CAN_READ"])."""
    # Both asked, whatever the first answers: the rule runs for a missing group as for one
    # that exists, so a refusal takes as long (and as many queries) as a missing group.
    exists = api.feed_exists(feed)
    allowed = api.may_read(user, feed)
    return exists and allowed


async def unwatch_feed(connection: Any, message: UnwatchFeed) -> None:
    await connection.hub.leave_topic(connection, KIND, message.feed)


async def deliver(hub: extensions.Topics, payload: Any) -> None:
    """What reaches the feed's topic kind: a new activity, or a recheck of watches."""
    if isinstance(payload, dict) and "recheck" in payload:
        await recheck(hub, payload.get("recheck"), payload.get("feeds"))
    else:
        await deliver_activity(hub, payload)


async def recheck(hub: extensions.Topics, ids: Any, feeds: Any) -> int:
    """Ask CAN_READ again for the timelines watched here by ``ids`` (encoded user ids; None: all)
    among ``feeds`` (None: all); unwatch each refused one on every connection of that user
    and tell it ``unknown_feed``. How many (user, timeline) were refused."""
    wanted = None if ids is None else {users.decode_id(uid) for uid in ids}
    names = None if feeds is None else set(feeds)
    asks: dict[tuple[UserId, str], list[Any]] = {}
    for connection, watched in hub.topic_members(KIND).items():
        if wanted is not None and connection.viewer_id not in wanted:
            continue
        for feed in watched if names is None else watched & names:
            asks.setdefault((connection.viewer_id, feed), []).append(connection)
    if not asks:
        return 0
    pairs = list(asks)
    # One trip to the database's thread for every (user, timeline): asked once per user,
    # whatever the number of their connections.
    allowed = await sync_to_async(_verdicts)([(asks[key][0].user, key[1]) for key in pairs])
    refused = [key for key, ok in zip(pairs, allowed, strict=True) if not ok]
    told: dict[Any, list[str]] = {}
    for key in refused:
        for connection in asks[key]:
            if key[1] not in hub.topics_of(connection, KIND):
                continue  # unwatched (or closed) while the rule was asked: nothing to tell
            # Out of the topic now: an activity queued for it is not sent (its send looks again).
            await hub.leave_topic(connection, KIND, key[1])
            told.setdefault(connection, []).append(key[1])

    async def send(connection: Any) -> None:
        for feed in told[connection]:
            refusal = _unknown_feed(feed)
            # The error a refused watch_feed gets, naming the feed; unasked, so no "answers".
            await connection.send_json(
                {"type": "error", "code": refusal.code, "message": refusal.message, "feed": feed}
            )

    if told:
        await hub.send_in_order(list(told), send, "a refused timeline")
    return len(refused)


def _verdicts(asks: list[tuple[Any, str]]) -> list[bool]:
    return [_readable(user, feed) for user, feed in asks]


async def deliver_activity(hub: extensions.Topics, payload: Any) -> None:
    """Send a new activity to the connections whose open timelines it belongs on and whose
    viewer may see it (one evaluation for all local viewers)."""
    activity_id = int(payload["activity"])
    members = hub.topic_members(KIND)
    watching: dict[UserId, set[str]] = {}
    for connection, feeds in members.items():
        watching.setdefault(connection.viewer_id, set()).update(feeds)
    try:
        activity, audience = await sync_to_async(api.live_audience)(activity_id, watching)
    except Exception:
        logger.exception("Presence: resolving the audience of activity %s failed", activity_id)
        return
    if activity is None:
        return

    async def send(connection: Any) -> None:
        # What the connection watches when its turn comes (it may have unwatched meanwhile).
        feeds = hub.topics_of(connection, KIND)
        matched = [name for name in audience.get(connection.viewer_id, ()) if name in feeds]
        if matched:
            await connection.send_json({"type": "activity", "feeds": matched, "activity": activity})

    # Through the hub's queue of each connection: a client that reads nothing (its server
    # holding the send) holds up no other watcher's frame, and its own come in order.
    told = [connection for connection in members if connection.viewer_id in audience]
    await hub.send_in_order(told, send, "an activity")


def _on_activity_posted(sender: Any, activity: Any, **kwargs: Any) -> None:
    # Sent again if the layer fails it: a post is still news a while later (and a repeat is
    # dropped by id, docs/websocket.md).
    extensions.announce_to_topic(KIND, {"activity": activity.pk}, retry=True)


def register() -> None:
    """Called from the feed's AppConfig.ready()."""
    # Every error answering them names the feed as the frame sent it: a client tells it from
    # the answer of its set_status.
    extensions.register_frame("watch_feed", parse_watch, watch_feed, named_by="feed")
    extensions.register_frame("unwatch_feed", parse_unwatch, unwatch_feed, named_by="feed")
    extensions.register_delivery(KIND, deliver)
    api.activity_posted.connect(_on_activity_posted, dispatch_uid="presence_live_activity")
