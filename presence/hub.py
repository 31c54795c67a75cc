"""Live fan-out: one hub per process (per event loop) between open connections and the others.

Interest-based: a process joins the channel-layer group of user X only while one of its
connections subscribes to X, so a change of X reaches the processes that have subscribers of X,
once each, and costs one delivery per subscribed connection there, never one per follower.

A change travels as "user X changed" (no presence in it): each hub resolves X for each of its
viewers through :func:`presence.api.apresence_for_viewers` (the one privacy resolver, three
queries and one Redis round trip per batch), compares with what each connection was last sent,
and sends a ``presence_diff`` only where the visible presence changed. A viewer who may not see
a change therefore receives nothing at all, at no different time.

Changes of one user are coalesced for COALESCE_WINDOW from the first one; each user's window is
its own, so the timing of a diff never depends on changes of other users.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from channels.layers import get_channel_layer
from django.db import close_old_connections
from django.db import connections as databases
from redis.exceptions import TimeoutError as RedisTimeoutError

from presence import announce, extensions, lifecycle
from presence.announce import (
    CHANGED,
    SESSION_ENDED,
    SESSIONS_CHANGED,
    TOPIC,
    account_group_name,
    group_name,
    layer_call,
    topic_group_name,
)
from presence.conf import get_settings
from presence.domain import Presence, UserId, visibly_differs
from presence.sessions import Credential
from presence.store import get_store
from presence.users import decode_id, id_decoder

logger = logging.getLogger("presence")

#: users resolved per delivery at most
DELIVER_BATCH = 200
#: how soon a pending batch counts as due (saves a wake-up per batch)
_TICK = 0.005


class Connection(Protocol):
    """What the hub needs of a consumer."""

    viewer_id: UserId
    #: the presence last sent for each subscribed user
    sent: dict[UserId, Presence]
    #: users whose snapshot is being read; a change meanwhile is delivered again after it
    snapshotting: set[UserId]

    async def send_presences(self, kind: str, presences: dict[UserId, Presence]) -> None: ...

    async def send_json(self, content: dict[str, Any]) -> None: ...

    #: what the connection authenticated with (presence.sessions), None when it is never
    #: re-checked (another authentication middleware)
    credential: Credential | None

    async def end_session(self) -> None:
        """Close the connection: its session ended."""

    async def recheck_session(self) -> None:
        """Close the connection if its session or token is no longer valid."""


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


class Hub:
    """The process's (event loop's) registry of live connections and their subscriptions."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.connections: set[Connection] = set()
        self.watchers: dict[UserId, set[Connection]] = {}
        #: the other way round: the users each connection watches (a close must not scan
        #: every watched user: tens of thousands in a busy process)
        self.watched: dict[Connection, set[UserId]] = {}
        #: topics of each connection (presence.extensions): kind -> connection -> keys
        self.topics: dict[str, dict[Connection, set[str]]] = {}
        self._delivering: set[asyncio.Task[None]] = set()
        #: connections of each user opened with a session or a token (see account_group_name)
        self.accounts: dict[UserId, set[Connection]] = {}
        self._session_tasks: set[asyncio.Task[None]] = set()
        #: user id -> loop time when its coalescing window ends
        self.pending: dict[UserId, float] = {}
        self.channel: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        #: watched users whose group this process could not join (the layer's Redis was down):
        #: joined again at each sweep, then resolved again (changes meanwhile went unheard)
        self.unjoined: set[UserId] = set()
        #: group -> channel: leaves the layer refused (its Redis was down), left again at each
        #: sweep unless wanted again meanwhile (a server that comes back with its data would
        #: otherwise keep sending this process what it no longer wants)
        self.undiscarded: dict[str, str] = {}
        #: announce.layer_failures when last looked at, and when to rejoin every group
        self._failures_seen = announce.layer_failures
        self._rejoin_all_at: float | None = None
        #: each group's last join or leave decided (they reach the layer in that order)
        self._group_turns: dict[str, asyncio.Future[None]] = {}
        #: the sweeps that go on after the last connection left (see _linger_sweeps)
        self._lingering: asyncio.Task[None] | None = None
        #: outages of presence's Redis that ended, when last looked at (see _after_outages)
        self._recoveries_seen = get_store().recoveries()
        #: announcements reach this process so late that some may be lost (see _note_lag)
        self.behind = False
        #: loop time of the last announcement that came too late
        self._last_late = 0.0

    @classmethod
    def current(cls) -> Hub | None:
        try:
            return _hubs.get(asyncio.get_running_loop())
        except RuntimeError:
            return None

    @classmethod
    def get(cls) -> Hub:
        loop = asyncio.get_running_loop()
        hub = _hubs.get(loop)
        if hub is None:
            hub = _hubs[loop] = cls()
            # Without a channel layer, announcements on this loop come straight here.
            announce.set_local_sink(hub.dispatch)
        return hub

    # --- connections and subscriptions ---

    async def attach(self, connection: Connection) -> None:
        """Register ``connection``; once this returns, the process is in its user's account
        group (announcements of logouts reach it), or the join failed and was logged."""
        first_socket = False
        joining = None
        group = account_group_name(connection.viewer_id)
        async with self._lock:
            self.connections.add(connection)
            if not self._tasks:
                await self._start()
            if connection.credential is not None:
                sockets = self.accounts.setdefault(connection.viewer_id, set())
                sockets.add(connection)
                first_socket = len(sockets) == 1
                # Another socket's join may still be on its way to the layer.
                joining = None if first_socket else self._group_turns.get(group)
        if first_socket:
            # Outside the lock (a storm of connections must not join one at a time); its turn
            # is taken at once, so a leave decided later runs after it.
            await self._group(self.layer and "group_add", group)
        elif joining is not None:
            await asyncio.shield(joining)

    async def detach(self, connection: Connection) -> None:
        # First out of the registry: a handler of this connection still running (or a frame
        # racing the close) can no longer watch anything for it.
        self.connections.discard(connection)
        await self.unwatch(connection, list(self.watched.get(connection, ())))
        for kind in [kind for kind, members in self.topics.items() if connection in members]:
            for key in list(self.topics[kind].get(connection, ())):
                await self.leave_topic(connection, kind, key)
        async with self._lock:
            sockets = self.accounts.get(connection.viewer_id)
            if sockets is not None and connection in sockets:
                sockets.discard(connection)
                if not sockets:
                    del self.accounts[connection.viewer_id]
                    await self._group(
                        self.layer and "group_discard", account_group_name(connection.viewer_id)
                    )
            if not self.connections and self._tasks:
                await self._stop()

    async def watch(self, connection: Connection, user_ids: Iterable[UserId]) -> None:
        if connection not in self.connections:
            return  # detached meanwhile (closed by the server while its frame was handled)
        first = []
        joining: list[asyncio.Future[None]] = []
        watched = self.watched.setdefault(connection, set())
        for user_id in user_ids:
            watchers = self.watchers.setdefault(user_id, set())
            if not watchers:
                first.append(user_id)
            elif (turn := self._group_turns.get(group_name(user_id))) is not None:
                # Another connection's join of this group is still on its way to the layer:
                # a snapshot read before it lands could miss a change announced meanwhile.
                joining.append(turn)
            watchers.add(connection)
            watched.add(user_id)
        await self._groups("group_add", first)
        if joining:
            await asyncio.gather(*(asyncio.shield(turn) for turn in joining))

    async def unwatch(self, connection: Connection, user_ids: Iterable[UserId]) -> None:
        last = []
        watched = self.watched.get(connection, set())
        for user_id in user_ids:
            watchers = self.watchers.get(user_id)
            if watchers is None or connection not in watchers:
                continue
            watchers.discard(connection)
            watched.discard(user_id)
            if not watchers:
                del self.watchers[user_id]
                self.pending.pop(user_id, None)
                self.unjoined.discard(user_id)
                last.append(user_id)
        if not watched:
            self.watched.pop(connection, None)
        await self._groups("group_discard", last)

    async def join_topic(self, connection: Connection, kind: str, key: str) -> None:
        """Give ``connection`` the topic ``key`` of ``kind``; this process then receives
        what is announced to ``kind`` (presence.extensions)."""
        if connection not in self.connections:
            return  # detached: a handler still running must not add anything for it
        members = self.topics.setdefault(kind, {})
        first = not members
        members.setdefault(connection, set()).add(key)
        if first:
            await self._group(self.layer and "group_add", topic_group_name(kind))

    async def leave_topic(self, connection: Connection, kind: str, key: str) -> None:
        members = self.topics.get(kind)
        keys = None if members is None else members.get(connection)
        if members is None or keys is None or key not in keys:
            return
        keys.discard(key)
        if not keys:
            del members[connection]
            if not members:
                del self.topics[kind]
                await self._group(self.layer and "group_discard", topic_group_name(kind))

    def topics_of(self, connection: Connection, kind: str) -> set[str]:
        """The keys of ``kind`` that ``connection`` has (a copy)."""
        return set(self.topics.get(kind, {}).get(connection, ()))

    def topic_members(self, kind: str) -> dict[Connection, set[str]]:
        """Every local connection with topics of ``kind``, and its keys (copies)."""
        return {c: set(keys) for c, keys in self.topics.get(kind, {}).items()}

    async def _group(self, method: str | None, group: str) -> None:
        channel = self.channel
        if method is None or channel is None:
            return
        before, mine = self._take_turn(group)
        try:
            await self._in_turn(group, before, mine, getattr(self.layer, method), channel)
        except Exception as error:
            logger.warning("Presence: channel layer %s failed (%s).", method, error)
            if method == "group_discard":
                self.undiscarded[group] = channel

    def session_message(self, message: dict[str, Any]) -> None:
        """A session of a user here logged out, or their sessions must be checked again."""
        try:
            user_id = decode_id(message["user"])
        except (KeyError, TypeError, ValueError):
            return  # not a message of this version's announcer
        sockets = list(self.accounts.get(user_id, ()))
        if message.get("type") == SESSION_ENDED:
            digest = message.get("session")
            ending = [c for c in sockets if c.credential and c.credential.session_digest == digest]
            calls = [connection.end_session() for connection in ending]
        else:
            calls = [connection.recheck_session() for connection in sockets]
        if calls:
            # Not on the receive loop: closing detaches, which may stop this hub's tasks.
            task = asyncio.ensure_future(self._run_session_calls(calls))
            self._session_tasks.add(task)
            task.add_done_callback(self._session_tasks.discard)

    async def _run_session_calls(self, calls: list[Coroutine[Any, Any, None]]) -> None:
        for call in calls:
            try:
                await call
            except Exception:
                logger.exception("Presence: closing the sockets of an ended session failed")

    def topic_message(self, kind: str, payload: Any) -> None:
        """Hand a payload announced to ``kind`` to its registered delivery, in a task of its
        own (a slow delivery must not hold up the receive loop)."""
        deliver = extensions.delivery(kind)
        if deliver is None or not self.topics.get(kind):
            return
        task = asyncio.ensure_future(self._deliver_topic(deliver, kind, payload))
        self._delivering.add(task)
        task.add_done_callback(self._delivering.discard)

    async def _deliver_topic(self, deliver: Any, kind: str, payload: Any) -> None:
        try:
            await deliver(self, payload)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Presence: delivering a %s message failed", kind)

    async def _groups(self, method: str, user_ids: list[UserId]) -> list[UserId]:
        """Join (group_add) or leave these users' groups; the users whose call failed."""
        # The channel as it is now: the hub may stop (its channel None) while this runs, when
        # the last connection leaves during another one's unwatch; the calls still complete.
        channel = self.channel
        if self.layer is None or channel is None or not user_ids:
            return []
        call = getattr(self.layer, method)
        failed: list[UserId] = []
        error: BaseException | None = None
        # Each user's turn is taken now, before any await, in the order the hub decided: a
        # join and a leave of one group (a connection subscribing while the last watcher
        # leaves) reach the layer in that order, never the other way round. The layer's calls
        # in flight are limited by announce.layer_call.
        turns = [(group, *self._take_turn(group)) for group in map(group_name, user_ids)]
        try:
            results = await asyncio.gather(
                *(
                    self._in_turn(group, before, mine, call, channel)
                    for group, before, mine in turns
                ),
                return_exceptions=True,
            )
        finally:
            for group, _, mine in turns:
                self._end_turn(group, mine)
        for uid, result in zip(user_ids, results, strict=True):
            if isinstance(result, Exception):
                failed.append(uid)
                error = result
            elif isinstance(result, BaseException):
                raise result  # a cancellation
        if failed:
            logger.warning(
                "Presence: channel layer %s failed for %d users (%s).", method, len(failed), error
            )
            if method == "group_add":
                # Joined again at the next sweep; until then their changes go unheard here.
                self.unjoined.update(uid for uid in failed if uid in self.watchers)
            else:
                self.undiscarded.update((group_name(uid), channel) for uid in failed)
        return failed

    def _take_turn(self, group: str) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """A place in ``group``'s queue of joins and leaves (taken when decided, before any
        await): the call after the one before it, whichever finishes its wait first."""
        before = self._group_turns.get(group)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._group_turns[group] = mine
        return before, mine

    def _end_turn(self, group: str, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._group_turns.get(group) is mine:
            del self._group_turns[group]

    async def _in_turn(
        self,
        group: str,
        before: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
        call: Any,
        channel: str,
    ) -> Any:
        try:
            if before is not None:
                await asyncio.shield(before)
            return await layer_call(call, group, channel)
        finally:
            self._end_turn(group, mine)

    def _after_outages(self) -> None:
        """When an outage of presence's Redis ended, resolve every watched user again:
        changes during it (a tab closed, a connection that expired) were not announced."""
        recoveries = get_store().recoveries()
        if recoveries != self._recoveries_seen:
            self._recoveries_seen = recoveries
            self.changed(list(self.watchers))

    def _after_layer_failures(self, now: float) -> None:
        """RETRY_INTERVAL after the last failed channel-layer call of this process, every
        watched user's group is joined again and resolved again: a layer server that failed may
        have lost messages, or come back empty (the core layer's groups are keys in it)."""
        if announce.layer_failures != self._failures_seen:
            self._failures_seen = announce.layer_failures
            self._rejoin_all_at = now + get_settings().RETRY_INTERVAL
        elif self._rejoin_all_at is not None and now >= self._rejoin_all_at:
            self._rejoin_all_at = None
            self.unjoined.update(self.watchers)

    def behind_after(self) -> float:
        """How late (seconds after it was sent) an announcement may reach this process before
        the process counts as behind its channel: a quarter of the layer's message expiry
        (channels_redis drops messages older than it, 60 s by default, and any message sent to
        a full channel)."""
        return float(getattr(self.layer, "expiry", 60)) / 4

    def _note_lag(self, sent: Any) -> None:
        """An announcement sent at ``sent`` arrived now. A process that cannot keep up with its
        channel receives announcements later and later, and past the layer's expiry or its
        capacity they are dropped without a word: views would stay wrong until the user's next
        change. Once it has caught up (see _after_lag), every watched user is resolved again."""
        if not isinstance(sent, (int, float)) or isinstance(sent, bool):
            return  # a message of an older version
        lag = time.time() - sent
        if lag < self.behind_after():
            return
        if not self.behind:
            logger.warning(
                "Presence: announcements reach this process %.0f s after they were sent: it is "
                "behind its channel, and the channel layer may drop some (its expiry, a full "
                "channel). Every watched user is resolved again once it has caught up; see the "
                "deployment docs on sizing.",
                lag,
            )
        self.behind = True
        self._last_late = asyncio.get_running_loop().time()

    def _after_lag(self, now: float) -> None:
        """Caught up (no late announcement for a whole sweep interval): every watched user is
        resolved again, since changes announced while behind may have been dropped."""
        if self.behind and now - self._last_late >= get_settings().SWEEP_INTERVAL:
            self.behind = False
            logger.warning("Presence: this process caught up with its channel; resyncing views.")
            self.changed(list(self.watchers))

    def _wanted_groups(self) -> set[str]:
        return (
            {group_name(uid) for uid in self.watchers}
            | {account_group_name(uid) for uid in self.accounts}
            | {topic_group_name(kind) for kind in self.topics}
        )

    async def leave_again(self) -> None:
        """Leave the groups whose leave failed, unless this channel wants them again."""
        if not self.undiscarded or self.layer is None:
            return
        wanted = self._wanted_groups()
        retry = {
            group: channel
            for group, channel in self.undiscarded.items()
            if not (channel == self.channel and group in wanted)
        }
        self.undiscarded.clear()
        for group, channel in retry.items():
            before, mine = self._take_turn(group)
            try:
                await self._in_turn(group, before, mine, self.layer.group_discard, channel)
            except Exception:
                self.undiscarded.setdefault(group, channel)

    async def rejoin(self) -> None:
        """Join the groups a failed group_add left out, and resolve those users again: their
        changes meanwhile did not reach this process."""
        retry = [uid for uid in self.unjoined if uid in self.watchers]
        self.unjoined.clear()
        if not retry:
            return
        failed = set(await self._groups("group_add", retry))
        self.changed(uid for uid in retry if uid not in failed)

    # --- changes ---

    def changed(self, user_ids: Iterable[UserId], announced_at: float | None = None) -> None:
        """Users whose presence may have changed: delivered after their coalescing window.

        The window counts from ``announced_at`` (when the change started, as its announcement
        says) when given: the time spent making the change and reaching this process is not
        added to it. It never
        ends before now nor later than a whole window from now (clocks of two hosts differ).
        """
        loop_now = asyncio.get_running_loop().time()
        window = get_settings().COALESCE_WINDOW
        if announced_at is not None:
            window -= min(max(time.time() - announced_at, 0.0), window)
        for user_id in user_ids:
            if user_id in self.watchers and user_id not in self.pending:
                self.pending[user_id] = loop_now + window
                self._wake.set()

    async def deliver(self, user_ids: Iterable[UserId]) -> None:
        """Resolve these users for every viewer subscribed to them here; send the diffs."""
        watchers = {uid: list(self.watchers[uid]) for uid in user_ids if self.watchers.get(uid)}
        if not watchers:
            return
        # A snapshot being read may be newer or older than what is read here: a connection
        # reading one (when this read starts or ends) is delivered to once more after it,
        # compared with the snapshot. The others get their diff now: one socket reloading
        # must not hold up everyone else's.
        reading = {
            (uid, connection)
            for uid, connections in watchers.items()
            for connection in connections
            if uid in connection.snapshotting
        }
        again: set[UserId] = set()
        resolved = await lifecycle.apresence_for_viewers(
            {uid: {c.viewer_id for c in connections} for uid, connections in watchers.items()}
        )
        if resolved is None:
            # Redis is unavailable: nothing is guessed; these users are tried again later.
            retry_at = asyncio.get_running_loop().time() + get_settings().RETRY_INTERVAL
            for uid in watchers:
                self.pending.setdefault(uid, retry_at)
            return
        outbox: dict[Connection, dict[UserId, Presence]] = {}
        for uid, connections in watchers.items():
            for connection in connections:
                if (uid, connection) in reading or uid in connection.snapshotting:
                    again.add(uid)
                    continue
                presence = resolved.get(uid, {}).get(connection.viewer_id)
                if presence is None or uid not in connection.sent:
                    continue  # the user was deleted, or the connection unsubscribed meanwhile
                if visibly_differs(connection.sent[uid], presence):
                    connection.sent[uid] = presence
                    outbox.setdefault(connection, {})[uid] = presence
        if again:
            self.changed(again)
        for connection, presences in outbox.items():
            try:
                await connection.send_presences("presence_diff", presences)
            except Exception:  # a connection closing under us must not stop the others
                logger.debug("Presence: could not send a diff", exc_info=True)

    # --- background tasks ---

    async def _start(self) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        if self.layer is not None:
            self.channel = await self.layer.new_channel()
            logger.info("Presence: the live hub listens on channel %s.", self.channel)
        self._tasks = [
            asyncio.ensure_future(self._deliver_loop()),
            asyncio.ensure_future(self._sweep_loop()),
        ]
        if self.layer is not None:
            self._tasks.append(asyncio.ensure_future(self._receive_loop()))

    async def _stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        tasks += list(self._delivering)
        self.pending.clear()
        # Groups connections still leaving hold (they left the registry, the last of them
        # stopped the hub, and they wait for the lock) are left now, while the hub still has
        # its channel: nothing of this process stays in the layer.
        await self._groups("group_discard", list(self.watchers))
        method = self.layer and "group_discard"
        for user_id in list(self.accounts):
            await self._group(method, account_group_name(user_id))
        for kind in list(self.topics):
            await self._group(method, topic_group_name(kind))
        self.channel = None
        # The users who were connected here turn offline after their grace even if no
        # connection opens here again (nor anywhere): this process sweeps on for a while.
        self._lingering = asyncio.ensure_future(self._linger_sweeps())
        for task in tasks:
            task.cancel()
        # Not waited for: a channel-layer receive can swallow its cancellation (channels_redis
        # with redis-py) and block until its BZPOPMIN times out (5 s), which would hold up this
        # close and every new connection (they wait on the hub's lock). Such a receive loop
        # ends by itself, its channel being gone; one more cancel usually ends it at once.
        if tasks:
            _, lingering = await asyncio.wait(tasks, timeout=_TICK)
            for task in lingering:
                task.cancel()

    async def _linger_sweeps(self) -> None:
        """Sweep every SWEEP_INTERVAL for CONNECTION_TTL + OFFLINE_GRACE after the last
        connection left: by then every user connected here is offline and out of the due
        schedule, even if this was the last process with connections."""
        conf = get_settings()
        loop = asyncio.get_running_loop()
        until = loop.time() + conf.CONNECTION_TTL + conf.OFFLINE_GRACE + 2 * conf.SWEEP_INTERVAL
        while loop.time() < until and not self._tasks:
            await asyncio.sleep(conf.SWEEP_INTERVAL)
            if self._tasks:
                return  # a connection came: the hub's own sweep loop runs again
            try:
                await self.leave_again()
                await lifecycle.asweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Presence: sweeping due users failed")

    async def _receive_loop(self) -> None:
        assert self.layer is not None and self.channel is not None
        channel = self.channel
        while self.channel == channel:  # the hub stopped (or restarted on a new channel)
            try:
                message = await self.layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except RedisTimeoutError:
                # An idle channel: the layer's blocking pop outlived the socket timeout.
                continue
            except Exception as error:
                if self.channel != channel:
                    return  # a cancellation the layer turned into an error
                logger.warning("Presence: channel layer receive failed (%s); retrying.", error)
                announce.note_layer_failure()
                await asyncio.sleep(get_settings().RETRY_INTERVAL)
                continue
            if self.channel != channel:
                continue
            self.dispatch(message)

    def dispatch(self, message: dict[str, Any]) -> None:
        """Act on one message announced through :mod:`presence.announce`."""
        if message.get("type") == CHANGED:
            # Ids in their canonical form (presence.users.encode_id), read as the site's pk.
            self._note_lag(message.get("sent"))
            decode = id_decoder()
            at = message.get("at")
            self.changed(
                (decode(uid) for uid in message.get("users", ())),
                announced_at=float(at)
                if isinstance(at, (int, float)) and not isinstance(at, bool)
                else None,
            )
        elif message.get("type") == TOPIC and isinstance(message.get("kind"), str):
            self.topic_message(message["kind"], message.get("payload"))
        elif message.get("type") in (SESSION_ENDED, SESSIONS_CHANGED):
            self.session_message(message)

    def _owns_current_task(self) -> bool:
        # A cancellation can be swallowed (sync_to_async waits for its thread and returns its
        # result): a loop whose hub stopped must end by itself.
        return asyncio.current_task() in self._tasks

    async def _deliver_loop(self) -> None:
        # The hub's database reads get a thread (and a database connection) of their own: a
        # delivery does not queue behind the queries of sockets and pages, which share one.
        async with ThreadSensitiveContext():
            try:
                await self._deliver_rounds()
            finally:
                # The thread ends with the context; its connection must not outlive it open.
                with contextlib.suppress(Exception):
                    await asyncio.shield(sync_to_async(databases.close_all)())

    async def _deliver_rounds(self) -> None:
        loop = asyncio.get_running_loop()
        while self._owns_current_task():
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            # At most DELIVER_BATCH at a time (the rest stay due: the next round takes them at
            # once): a resync of every watched user must not hold the loop, nor its memory.
            due = [uid for uid, at in self.pending.items() if at <= now + _TICK][:DELIVER_BATCH]
            if not due:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(self.pending.values()) - now)
                continue
            for uid in due:
                del self.pending[uid]
            try:
                await self.deliver(due)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The database failed (a connection terminated, a failover): these users are
                # delivered again after RETRY_INTERVAL, on a fresh connection.
                logger.exception("Presence: delivering live updates failed; retrying shortly")
                retry_at = loop.time() + get_settings().RETRY_INTERVAL
                for uid in due:
                    if uid in self.watchers:
                        self.pending.setdefault(uid, retry_at)
                with contextlib.suppress(Exception):
                    await sync_to_async(close_old_connections)()

    async def _sweep_loop(self) -> None:
        loop = asyncio.get_running_loop()
        # Channel-layer groups expire (channels_redis: group_expiry, a day by default): renew
        # the memberships of long-lived subscriptions at half that.
        renew_every = float(getattr(self.layer, "group_expiry", 86400)) / 2
        renewed = loop.time()
        while self._owns_current_task():
            await asyncio.sleep(get_settings().SWEEP_INTERVAL)
            try:
                if loop.time() - renewed >= renew_every:
                    renewed = loop.time()
                    await self._groups("group_add", list(self.watchers))
                    for kind in list(self.topics):
                        await self._group(self.layer and "group_add", topic_group_name(kind))
                    for user_id in list(self.accounts):
                        await self._group(self.layer and "group_add", account_group_name(user_id))
                self._after_outages()
                self._after_layer_failures(loop.time())
                self._after_lag(loop.time())
                if self.unjoined:
                    await self.rejoin()
                await self.leave_again()
                await lifecycle.asweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Presence: sweeping due users failed")
