"""Announcing changes to the live processes: the low-level side of the live layer.

Anything that changes what others may see (the API, the edge receivers, installed apps through
:mod:`presence.extensions`) announces it here; each process's :class:`presence.hub.Hub` receives
it through the channel layer. Messages carry no presence, only "user X changed" (the hub resolves
it per viewer), "session S of user X ended" (a digest, never the key) or a topic payload.

Each announcement has an async face, sent from the caller's event loop, and a sync one for sync
code (views, the admin, receivers), which :mod:`presence.layer` sends: from the event loop whose
database call made it, or else on the process's announcer loop.

Without a channel layer, announcements reach only the hub of the announcing event loop, through
the sink that hub registers (:func:`set_local_sink`); this module never imports the hub.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any

from channels.layers import get_channel_layer

from presence import metrics, room_sends, sessions
from presence.conf import get_settings, stamps_kept
from presence.domain import ALL_KINDS, ANY_CHANGE, Change, Kind, UserId
from presence.layer import (
    account_group_name,
    group_name,
    holding,
    layer_slot,
    room_group_name,
    rooms_group_name,
    run_from_sync,
    topic_group_name,
    with_members,
)
from presence.sessions import session_digest
from presence.signals import presence_changed
from presence.store import Plan, get_store, merge
from presence.users import encode_id, id_decoder

logger = logging.getLogger("presence")

#: channel-layer message type of "these users changed" (handled by the hub, not by consumers)
CHANGED = "presence.changed"
#: channel-layer message type of "a payload for topic kind K" (presence.extensions)
TOPIC = "presence.topic"
#: channel-layer message types for the sockets of one user's sessions: "this session logged out"
#: (with a digest of its key, never the key) and "check your sessions again" (password change)
SESSION_ENDED = "presence.session_ended"
SESSIONS_CHANGED = "presence.sessions_changed"
#: channel-layer message type of "this user was deleted": their sockets close (4401) at once
USER_DELETED = "presence.user_deleted"


#: a hub's handler of announced messages
Sink = Callable[[dict[str, Any]], None]
#: event loop -> the hub's message handler there (no channel layer: local delivery only)
_local_sinks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Sink] = (
    weakref.WeakKeyDictionary()
)


def set_local_sink(sink: Sink) -> None:
    """Where announcements made on the running event loop go when there is no channel layer
    (the hub of that loop registers its message handler)."""
    _local_sinks[asyncio.get_running_loop()] = sink


def _deliver_locally(message: dict[str, Any]) -> None:
    try:
        sink = _local_sinks.get(asyncio.get_running_loop())
    except RuntimeError:
        return
    if sink is not None:
        sink(message)


#: group_send calls in flight at once for one announcement
_SENDS_AT_ONCE = 16
#: a change that could not be announced (the layer's Redis down) is announced again after
#: RETRY_INTERVAL, doubling, this many times: views catch up once the layer is back
ANNOUNCE_RETRIES = 5

_retrying: set[asyncio.Task[None]] = set()
#: users with a change being stamped or announced again by this process (see retrying)
_unsettled: collections.Counter[UserId] = collections.Counter()


def retrying(user_id: UserId) -> bool:
    """Whether a change of this user's is still being stamped or announced again here: the
    writes of their connections meanwhile leave those unsettled (lua/connection.lua), so that
    dropping one of them, should this process die, is announced."""
    return user_id in _unsettled


def _retry_in_background(work: Coroutine[Any, Any, None], user_ids: list[UserId]) -> None:
    _unsettled.update(user_ids)
    task = asyncio.ensure_future(work)
    _retrying.add(task)

    def done(task: asyncio.Task[None]) -> None:
        _retrying.discard(task)
        _unsettled.subtract(user_ids)
        for user_id in user_ids:
            if _unsettled[user_id] <= 0:
                del _unsettled[user_id]

    task.add_done_callback(done)


#: channel-layer calls of this process that failed so far (hubs resync after failures stop)
layer_failures = 0


async def layer_call(method: Any, *args: Any) -> Any:
    """``await method(*args)`` on the channel layer, within the loop's limit of calls; a
    failure is counted in :data:`layer_failures`."""
    async with layer_slot():
        try:
            return await method(*args)
        except Exception:
            note_layer_failure()
            raise


def note_layer_failure() -> None:
    global layer_failures
    layer_failures += 1
    metrics.LAYER_FAILURES.inc()


# --- announcing changes -----------------------------------------------------------------------


#: when the change being made started: the frame or request making it arrived (set around
#: its handling with :func:`change_started_at`; copied into sync_to_async's thread with the
#: context). An announcement carries it, so that coalescing windows count from it.
_change_started: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "presence_change_started", default=None
)


@contextlib.contextmanager
def change_started_at(when: float) -> Iterator[None]:
    """Changes announced within this block started at ``when`` (epoch seconds)."""
    token = _change_started.set(when)
    try:
        yield
    finally:
        _change_started.reset(token)


#: a change of each user announced, or one change of them all
Changes = Change | Mapping[UserId, Change]


def _each(user_ids: Iterable[UserId], changes: Changes) -> dict[UserId, Change]:
    if isinstance(changes, Change):
        return dict.fromkeys(user_ids, changes)
    return {uid: changes.get(uid, ANY_CHANGE) for uid in user_ids}


def _grouped(each: Mapping[UserId, Change]) -> dict[Change, list[UserId]]:
    groups: dict[Change, list[UserId]] = {}
    for uid, change in each.items():
        groups.setdefault(change, []).append(uid)
    return groups


def change_fields(change: Change) -> dict[str, Any]:
    """A change's kinds as a "changed" message carries them (read by :func:`change_of`)."""
    if change.kinds & Kind.RELATION:
        return {"kinds": int(change.kinds), "between": [encode_id(u) for u in change.between]}
    return {"kinds": int(change.kinds)}


def change_of(message: Mapping[str, Any]) -> Change:
    """The change a "changed" message announces; of unknown kind where it says none (an
    announcer of an earlier version) or what it says cannot be read."""
    kinds = message.get("kinds")
    if not isinstance(kinds, int) or isinstance(kinds, bool) or not 0 <= kinds <= ALL_KINDS:
        return ANY_CHANGE
    between = message.get("between") or ()
    try:
        decode = id_decoder()
        return Change(Kind(kinds), frozenset(decode(uid) for uid in between))
    except (TypeError, ValueError):
        return ANY_CHANGE


async def aannounce(
    user_ids: Iterable[UserId],
    at: float | None = None,
    *,
    stamped: bool = False,
    change: Changes = ANY_CHANGE,
) -> None:
    """Tell every process with subscribers of these users that their presence may have changed
    (``at``: when the change started; default: as :func:`change_started_at` set it, or now),
    and what kind of change it was (``change``: one for all, or each user's; the viewers who
    cannot see such a change are not told: domain.Change.seen_by).

    Never raises: users whose announcement could not be sent are logged and announced again
    later (ANNOUNCE_RETRIES), so their viewers catch up once the channel layer is back.
    """
    each = _each(user_ids, change)
    if not each:
        return
    ids = list(each)
    if at is None:
        at = _change_started.get()
    stamp = time.time() if at is None else min(at, time.time())
    # Stamped before anyone is told: a socket that opens meanwhile either finds the stamp or
    # is watching already when the announcement comes (presence.stamps). ``stamped``: the
    # write that made the change stamped it (a socket's open, lua/connection.lua).
    if not stamped:
        await astamp_changes(ids, each)
    layer = get_channel_layer()
    if layer is None:
        for kind, group in _grouped(each).items():
            _deliver_locally(
                {
                    "type": CHANGED,
                    "users": [encode_id(uid) for uid in group],
                    "at": stamp,
                    **change_fields(kind),
                }
            )
        return
    failed = await _send_changes(layer, each, stamp)
    if failed:
        _retry_in_background(_announce_later(layer, failed), list(failed))


async def astamp_changes(user_ids: list[UserId], change: Changes = ANY_CHANGE) -> None:
    """Record in Redis that these users' visible presence changed now, in ``change``'s kinds
    (change stamps: a page or a reconnecting client that shows what it resolved before is
    sent them, if it may see such a change; presence.stamps). The time is taken now, after the
    change was made, not when it started: a page resolved while it was under way may not show
    it. Never raises: a write that failed is tried again after RETRY_INTERVAL (doubling,
    ANNOUNCE_RETRIES times), stamped at that later time."""
    store = get_store()
    # A change nobody else can see (a status saved as it was) is no change since any stamp.
    each = {uid: kind for uid, kind in _each(user_ids, change).items() if kind.kinds}
    if not each or await _stamp(store, each):
        return
    _retry_in_background(_stamp_later(store, each), list(each))


async def _stamp(store: Any, each: dict[UserId, Change]) -> bool:
    """Stamp each user's change now, in one round trip; False when Redis is unavailable."""
    now, keep = time.time(), stamps_kept(get_settings())
    plans: list[Plan[bool]] = [
        store.plans.stamp_changes(group, now, keep, kind) for kind, group in _grouped(each).items()
    ]
    done: list[bool] = await store.arun(merge(plans), live=True)
    return all(done)


async def _stamp_later(store: Any, each: dict[UserId, Change]) -> None:
    delay = get_settings().RETRY_INTERVAL
    for _ in range(ANNOUNCE_RETRIES):
        await asyncio.sleep(delay)
        if get_store() is not store:
            return  # another configuration of presence's Redis: its stamps are not these
        if await _stamp(store, each):
            return
        delay *= 2
    logger.warning(
        "Presence: gave up stamping a change of %d users %s; pages rendered before it may "
        "show them as they were until their next change.",
        len(each),
        list(each)[:20],
    )


async def _announce_later(layer: Any, each: dict[UserId, Change]) -> None:
    delay = get_settings().RETRY_INTERVAL
    for _ in range(ANNOUNCE_RETRIES):
        await asyncio.sleep(delay)
        # Stamped again first: a fresh stamp a hub sent meanwhile (presence.consumers.
        # restamping) proved only that the announcements sent before it were delivered.
        await astamp_changes(list(each), each)
        each = await _send_changes(layer, each, time.time(), again=True)
        if not each:
            return
        delay *= 2
    logger.warning(
        "Presence: gave up announcing a change of %d users %s; their viewers catch up at their "
        "next change.",
        len(each),
        list(each)[:20],
    )


async def _send_changes(
    layer: Any, each: dict[UserId, Change], at: float, again: bool = False
) -> dict[UserId, Change]:
    """Send "changed" to each user's group; the users whose send failed."""
    # Groups nobody is in are not sent to (most of an announcement's round trips otherwise).
    names = {user_id: group_name(user_id) for user_id in each}
    occupied = await with_members(layer, list(names.values()))
    ids = [user_id for user_id, name in names.items() if name in occupied]
    # Each user's group on its own: with the layer sharded over several servers, a server down
    # fails only the groups it holds, and the others are still told.
    failed: dict[UserId, Change] = {}
    error: BaseException | None = None
    for start in range(0, len(ids), _SENDS_AT_ONCE):
        batch = ids[start : start + _SENDS_AT_ONCE]
        sent = time.time()
        results = await asyncio.gather(
            *(
                layer_call(
                    layer.group_send,
                    group_name(user_id),
                    # When the change started: a hub's coalescing window counts from then,
                    # not from when the message reached it (see Hub.changed). When it was
                    # sent: a hub receiving it much later is behind its channel (Hub.behind).
                    {
                        "type": CHANGED,
                        "users": [encode_id(user_id)],
                        "at": at,
                        "sent": sent,
                        **change_fields(each[user_id]),
                    },
                )
                for user_id in batch
            ),
            return_exceptions=True,
        )
        for user_id, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):  # the layer's Redis is down, full, ...
                failed[user_id] = each[user_id]
                error = result
    if failed and not again:
        logger.warning(
            "Presence: could not announce a change of %d of %d users %s (%s); retrying.",
            len(failed),
            len(ids),
            list(failed)[:20],
            error,
        )
    return failed


def announce(
    user_ids: Iterable[UserId], *, stamped: bool = False, change: Changes = ANY_CHANGE
) -> None:
    """:func:`aannounce` for sync code (views, signal receivers)."""
    # The coroutine runs on the announcer's loop, outside this context: the start is passed.
    run_from_sync(
        aannounce(list(user_ids), _change_started.get(), stamped=stamped, change=change),
        "a change",
    )


def announce_change(user_ids: list[UserId], change: Changes, stamped: bool = False) -> None:
    """:func:`announce` with its change given in place: for an operation's ``call``, which
    passes arguments by position."""
    announce(user_ids, stamped=stamped, change=change)


async def aannounce_change(user_ids: list[UserId], change: Changes, stamped: bool = False) -> None:
    """:func:`aannounce` with its change given in place (see :func:`announce_change`)."""
    await aannounce(user_ids, stamped=stamped, change=change)


#: (user id, reason) of the ``presence_changed`` presence is sending for a change it announced
_own_change: contextvars.ContextVar[tuple[UserId, str] | None] = contextvars.ContextVar(
    "presence_own_change", default=None
)


def changed(
    user_ids: Iterable[UserId],
    reason: str,
    sender: Any = None,
    reordered: Iterable[UserId] = (),
    change: Changes = ANY_CHANGE,
) -> None:
    """A change presence made to what others may see of ``user_ids`` (a status, privacy,
    contacts, blocks; called after its commit): announced to the live processes, then
    :data:`presence.signals.presence_changed` sent for each user, the hook for sites. Made in a
    database call of an event loop's operation (presence.layer), it is that loop's
    :func:`achanged`.

    ``reordered``: users whose place in someone's room lists changed though what others may
    see of them did not (the user a contact row names: its owner lists them first), told to
    the rooms only (:func:`room_users`). ``change``: its kinds (:func:`aannounce`)."""
    ids = list(user_ids)
    more = list(reordered)
    if holding():
        run_from_sync(achanged(ids, reason, sender, more, change), "a change")
        return
    announce(ids, change=change)
    if get_settings().ROOMS:
        run_from_sync(aannounce_room_members_changed(room_users(ids, more)), "a change to rooms")
    for user_id in ids:
        with _own(user_id, reason):
            presence_changed.send(sender=sender, user_id=user_id, reason=reason)


async def achanged(
    user_ids: Iterable[UserId],
    reason: str,
    sender: Any = None,
    reordered: Iterable[UserId] = (),
    change: Changes = ANY_CHANGE,
) -> None:
    """:func:`changed` on an event loop: announced from it, then ``presence_changed`` sent (its
    sync receivers in the database's thread, as ``Signal.asend`` runs them)."""
    ids = list(user_ids)
    await aannounce(ids, change=change)
    if get_settings().ROOMS:
        await aannounce_room_members_changed(room_users(ids, reordered))
    for user_id in ids:
        with _own(user_id, reason):
            await presence_changed.asend(sender=sender, user_id=user_id, reason=reason)


def room_users(user_ids: Iterable[UserId], reordered: Iterable[UserId]) -> list[UserId]:
    """The users a change is announced to the rooms for: those others may see differently,
    and those whose place in a list changed (``reordered``). A room's list puts its viewer's
    contacts first: a viewer following a member present (or unfollowing one) reorders the
    viewer's own list, and only a view that looks at that member again lists it there (a
    full list's last member makes way for it; an unfollowed contact past the end makes way
    for the next member). The member's presence is unchanged for everyone: each view that
    looks at it again and sees no change is sent no frame."""
    return list(dict.fromkeys([*user_ids, *reordered]))


@contextlib.contextmanager
def _own(user_id: UserId, reason: str) -> Iterator[None]:
    token = _own_change.set((user_id, reason))
    try:
        yield
    finally:
        _own_change.reset(token)


def announced_already(user_id: UserId, reason: str) -> bool:
    """Whether this ``presence_changed`` is presence's own, sent by :func:`changed` for a
    change it announced already (a site's own ``presence_changed`` is not)."""
    return _own_change.get() == (user_id, reason)


async def _asend_to_group(
    group: str, message: dict[str, Any], what: str, *, retry: bool = False
) -> None:
    """Send ``message`` to the processes in ``group`` (without a channel layer, to this one's
    hub). Never raises: a failure is logged, naming ``what`` was sent; with ``retry``, it is
    sent again later (:func:`_send_to_group_later`)."""
    layer = get_channel_layer()
    if layer is None:
        _deliver_locally(message)
        return
    try:
        await layer_call(layer.group_send, group, message)
    except Exception as error:
        logger.warning(
            "Presence: could not send %s (%s)%s.", what, error, "; retrying" if retry else ""
        )
        if retry:
            _retry_in_background(_send_to_group_later(layer, group, message, what), [])


async def _send_to_group_later(layer: Any, group: str, message: dict[str, Any], what: str) -> None:
    """Send ``message`` to ``group`` again after RETRY_INTERVAL, doubling, ANNOUNCE_RETRIES
    times at most, until a send lands. A group the layer shows empty is not sent to yet: a
    server that came back empty has lost it, and the processes in it join it again (after
    RETRY_INTERVAL, at their sweep) before a send there reaches anyone."""
    delay = get_settings().RETRY_INTERVAL
    for _ in range(ANNOUNCE_RETRIES):
        await asyncio.sleep(delay)
        delay *= 2
        if group not in await with_members(layer, [group]):
            continue
        try:
            await layer_call(layer.group_send, group, message)
        except Exception:
            continue
        return
    logger.warning("Presence: gave up sending %s; it reached no process.", what)


async def _asend_account(user_id: UserId, message: dict[str, Any]) -> None:
    what = f"{message['type']} to the sockets of user {user_id}"
    await _asend_to_group(account_group_name(user_id), message, what)


async def aannounce_session_ended(user_id: UserId, session_key: str) -> None:
    """Close the sockets of this session (logout), in every process. Never raises."""
    digest = session_digest(session_key)
    # Marked first: a socket whose process joins the account group after the announcement
    # passed finds the mark once it has joined (presence.sessions).
    store = get_store()
    await store.arun(sessions.mark_session_ended_plan(store, user_id, digest))
    message = {"type": SESSION_ENDED, "user": encode_id(user_id), "session": digest}
    await _asend_account(user_id, message)


def announce_session_ended(user_id: UserId, session_key: str) -> None:
    run_from_sync(aannounce_session_ended(user_id, session_key), "a logout")


async def aannounce_sessions_changed(user_id: UserId) -> None:
    """Have every socket of this user check its session again (a password change invalidates
    the other sessions, and tokens; so does a deactivation). Never raises."""
    store = get_store()
    await store.arun(sessions.mark_account_changed_plan(store, user_id))
    await _asend_account(user_id, {"type": SESSIONS_CHANGED, "user": encode_id(user_id)})


def announce_sessions_changed(user_id: UserId) -> None:
    run_from_sync(aannounce_sessions_changed(user_id), "a session change")


async def aannounce_user_deleted(user_id: UserId) -> None:
    """Close every socket of this deleted user (4401), in every process, leaving their rooms
    at once. Never raises. Marked first, as a password change is: a socket whose process joins
    the account group after the announcement checks its session, and finds no user."""
    store = get_store()
    await store.arun(sessions.mark_account_changed_plan(store, user_id))
    await _asend_account(user_id, {"type": USER_DELETED, "user": encode_id(user_id)})


async def aannounce_to_topic(kind: str, payload: Any, *, retry: bool = False) -> None:
    """Send ``payload`` to every process with connections that have topics of ``kind``; each
    hands it to the delivery registered for ``kind`` (presence.extensions). Never raises.
    ``retry``: a send that failed (the layer's Redis down) is made again after RETRY_INTERVAL,
    doubling, ANNOUNCE_RETRIES times, as a change's announcement is; the payload may then
    arrive twice (the failed send may have landed), which its delivery must allow for."""
    message = {"type": TOPIC, "kind": kind, "payload": payload}
    what = f"a message to topic {kind}"
    await _asend_to_group(topic_group_name(kind), message, what, retry=retry)


def announce_to_topic(kind: str, payload: Any, *, retry: bool = False) -> None:
    """:func:`aannounce_to_topic` for sync code (views, signal receivers)."""
    run_from_sync(aannounce_to_topic(kind, payload, retry=retry), f"a {kind} message")


# --- rooms (presence.rooms.writes, presence.hub.rooms) -------------------------------------------

#: channel-layer message type of "these users joined, left or changed in room R"
ROOM = "presence.room"
#: channel-layer message type of "ask room R's rule again for these members (all: None)"
ROOM_RECHECK = "presence.room_recheck"
#: channel-layer message type of "what others may see of these users changed" (privacy,
#: contacts, blocks, status), to every process with room views: rooms they are in are redrawn
ROOM_MEMBERS_CHANGED = "presence.room_members_changed"


async def aannounce_room(room: str, user_ids: Iterable[UserId]) -> None:
    """Tell the processes with connections in ``room`` that these users joined, left or
    changed their meta there (no state: each process reads it). Never raises.

    One message per room at a time from this event loop: the users announced while the room's
    previous message is being sent go together in the next (presence.room_sends), so a burst
    of joins is a few messages, not one per join for every process to receive in turn."""
    users = [encode_id(uid) for uid in dict.fromkeys(user_ids)]
    if not users:
        return  # nobody joined, left or changed (a batch's joins of users present already)
    at = _change_started.get() or time.time()
    if get_channel_layer() is None:
        _deliver_locally({"type": ROOM, "room": room, "users": users, "at": at})
        return
    await room_sends.send(room, users, at, _send_room)


async def _send_room(room: str, users: list[Any], at: float) -> None:
    message = {"type": ROOM, "room": room, "users": users, "at": at}
    await _asend_to_group(room_group_name(room), message, f"a change to room {room}")


async def aannounce_room_members_changed(user_ids: Iterable[UserId]) -> None:
    """Tell every process with room views that what others may see of these users changed."""
    message = {"type": ROOM_MEMBERS_CHANGED, "users": [encode_id(uid) for uid in user_ids]}
    await _asend_to_group(rooms_group_name(), message, "a change to rooms' members")


async def aannounce_room_recheck(room: str, users: list[int | str] | None) -> None:
    """Have the processes with connections in ``room`` ask its rule again for these members
    (encoded ids; all when None). Never raises."""
    message = {"type": ROOM_RECHECK, "room": room, "users": users}
    await _asend_to_group(room_group_name(room), message, f"a recheck of room {room}")
