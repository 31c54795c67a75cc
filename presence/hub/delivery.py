"""Delivery of changes: "user X changed" becomes a ``presence_diff`` to each connection here
that watches X and may see the change, at the first tick after it of the process's grid (a
tick every COALESCE_WINDOW, presence.hub.room_windows.next_tick, as rooms are delivered).

Why a grid, not a window opened by X's first change: a viewer's diff must come at a time that
depends only on changes it may see. A change of X it may not see (X's relation with someone
else) would open the window, and the visible change that follows would reach it sooner."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import close_old_connections
from django.db import connections as databases

from presence import lifecycle, metrics
from presence.conf import get_settings
from presence.domain import (
    ANY_CHANGE,
    HIDDEN,
    Change,
    Presence,
    UserId,
    add_change,
    visibly_differs,
)
from presence.hub import sends
from presence.hub.registry import Connection, Registry
from presence.hub.room_windows import is_due, next_tick

logger = logging.getLogger("presence")

#: users resolved per delivery at most
DELIVER_BATCH = 200
#: a moment's wait (a stopping hub's tasks)
TICK = 0.005
#: how often the end of snapshot reads that held up a delivery is looked for
SNAPSHOT_POLL = 0.05
#: users resolved again per chunk of a resync (after an outage, a layer failure, lag)
RESYNC_BATCH = 200
#: the share of the time a resync may take: after a chunk that took t seconds, the next one
#: waits 3 t; live changes, the sockets' frames and the channel's intake go first meanwhile
RESYNC_SHARE = 0.25
#: a resync kept waiting this long past its turn by live work takes one chunk anyway
RESYNC_STARVED = 1.0


class ResyncPace:
    """When the next chunk of a resync may run: resolving every watched user again (20,000 in a
    busy process) must not take the time the live work needs, or the resync that follows a lag
    would feed the lag. Pure (times are passed in), so that the rule is tested on its own."""

    def __init__(self, share: float = RESYNC_SHARE, batch: int = RESYNC_BATCH) -> None:
        self.share = share
        self.batch = batch
        #: users waiting to be resolved again, in the order asked (a dict as an ordered set)
        self.waiting: dict[UserId, None] = {}
        #: the earliest time the next chunk may start
        self.next_at = 0.0

    def request(self, user_ids: Iterable[UserId]) -> None:
        self.waiting.update(dict.fromkeys(user_ids))

    def discard(self, user_id: UserId) -> None:
        """A live delivery of this user is coming: it resolves them afresh anyway."""
        self.waiting.pop(user_id, None)

    def may_run(self, now: float, live_due: bool) -> bool:
        """Live work first; a chunk once its pause is over (or when starved of its share)."""
        if not self.waiting or now < self.next_at:
            return False
        return not live_due or now >= self.next_at + RESYNC_STARVED

    def take(self, keep: Callable[[UserId], bool]) -> list[UserId]:
        """The next chunk of users (those ``keep`` still wants), out of the waiting ones."""
        chunk: list[UserId] = []
        while self.waiting and len(chunk) < self.batch:
            uid = next(iter(self.waiting))
            del self.waiting[uid]
            if keep(uid):
                chunk.append(uid)
        return chunk

    def spent(self, started: float, ended: float) -> None:
        """A chunk ran from ``started`` to ``ended``: the next waits so that the resync keeps
        to its share."""
        self.next_at = ended + (ended - started) * (1 - self.share) / self.share

    def wake_at(self) -> float | None:
        return self.next_at if self.waiting else None


class Proof:
    """A connection's claim "every change announced before :attr:`at` has been delivered to
    me", being proven (docs/websocket.md, "Fresh stamps"): the hub sends a probe to its own
    channel after ``at``; the channel is first in, first out, so once the probe is back every
    announcement sent before it is here, pending or delivered (:meth:`Delivery.settle_point`
    notes which of the connection's users still wait); once each of those was delivered to the
    connection, the claim holds."""

    __slots__ = ("at", "counters", "waiting")

    def __init__(self, at: float, counters: tuple[object, ...]) -> None:
        #: epoch seconds, taken before the probe was sent
        self.at = at
        #: the hub's recovery counters when it was sent (an outage, a layer failure, a
        #: catch-up since voids it: changes may have gone unannounced)
        self.counters = counters
        #: None until the probe is back; then user -> the delivery round that settles them for
        #: the connection (that round or a later one)
        self.waiting: dict[UserId, int] | None = None

    def proven(self, connection: Connection) -> bool:
        """The probe is back and every user that waited has been delivered (or is no longer
        subscribed)."""
        waiting = self.waiting
        if waiting is None:
            return False
        sent, reading = connection.sent, connection.snapshotting
        return not any(uid in sent or uid in reading for uid in waiting)


async def _send_diff(connection: Connection, presences: dict[UserId, Presence]) -> None:
    """Send what the connection was last sent of these users, as its diff; looked at when it
    goes (a send before it may have waited): a user unsubscribed from meanwhile is left out, and
    one whose presence was sent anew since (a snapshot of a new subscription, a later round's
    diff, which goes after this one) is not sent this older reading."""
    sent = connection.sent
    if any(sent.get(uid) is not presence for uid, presence in presences.items()):
        presences = {uid: p for uid, p in presences.items() if sent.get(uid) is p}
        if not presences:
            return
    await connection.send_presences("presence_diff", presences)


class Delivery:
    """The users waiting for their tick of the grid, and the loop that delivers them."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        #: user id -> the tick (loop time) it is delivered at
        self.pending: dict[UserId, float] = {}
        #: user id -> the tick of its last delivery (the next one is a window after it at least)
        self.delivered_at: dict[UserId, float] = {}
        #: users to resolve again below the live work (see ResyncPace)
        self.resyncing = ResyncPace()
        #: users whose delivery skipped connections reading their snapshot: resolved again once
        #: such a read is over (not at every window meanwhile: in a reconnect storm reads are
        #: slow, and resolving a user for all its watchers at each window fed the storm)
        self.after_snapshots: dict[UserId, set[Connection]] = {}
        #: pending users to deliver only to these connections (their snapshot read held up a
        #: delivery: the other watchers had it); a change of the user makes it everyone's again
        self.only: dict[UserId, set[Connection]] = {}
        #: the kinds of the changes of users due (pending, or held up by snapshot reads): a
        #: connection whose last view of a user is not known here (a page's, left out of a
        #: stamped snapshot) is sent a change only if it may see such a change
        self.changes: dict[UserId, Change] = {}
        self.after_changes: dict[UserId, Change] = {}
        #: deliveries begun so far, and the users of the one under way (see Proof)
        self.rounds = 0
        self.in_flight: dict[UserId, list[Connection]] = {}
        #: the users of the round under way that a connection subscribed to again meanwhile
        #: (an unsubscribe, then a subscribe): its snapshot may be newer than the round's read
        self.rewatched: set[tuple[UserId, Connection]] = set()
        #: the diffs go out through it: each connection's in order, no round held up by a
        #: client that reads nothing
        self.sending = sends.InOrder()
        #: the claims of connections being proven (Proof); few at a time
        self.proofs: dict[Connection, Proof] = {}
        self._wake = asyncio.Event()

    def changed(
        self,
        user_ids: Iterable[UserId],
        announced_at: float | None = None,
        change: Change = ANY_CHANGE,
    ) -> None:
        """Users whose presence may have changed (``change``: in what way): delivered at the
        first tick after the change (made at ``announced_at``, when it started, as its
        announcement says; None: now), and a window after each user's last delivery at least.

        Never before now, and never later than a window from now but for that floor (clocks of
        two hosts differ: next_tick). Whatever else of the user changed before: a change a
        viewer may not see must not bring the diff of one it may see sooner."""
        tick = next_tick(announced_at)
        window = get_settings().COALESCE_WINDOW
        delivered_at = self.delivered_at
        watchers = self.registry.watchers.members
        resyncing = self.resyncing
        changes = self.changes
        for user_id in user_ids:
            # A change is every watcher's (or a user's left unwatched meanwhile: none).
            self.only.pop(user_id, None)
            if user_id in watchers:
                add_change(changes, user_id, change)
            if user_id in watchers and user_id not in self.pending:
                self.pending[user_id] = max(tick, delivered_at.get(user_id, -math.inf) + window)
                resyncing.discard(user_id)
                self._wake.set()
            elif user_id in self.pending:
                metrics.COALESCED.inc()

    def resync(self, user_ids: Iterable[UserId]) -> None:
        """Users to resolve again, in chunks paced below the live work (ResyncPace): after an
        outage, a layer failure or lag, when any of them may have missed a change."""
        watchers = self.registry.watchers.members
        pending, only = self.pending, self.only
        again: list[UserId] = []
        for uid in user_ids:
            if uid not in watchers:
                continue
            if uid not in pending:
                again.append(uid)
                continue
            # Due already: that delivery resolves them afresh, for everyone (one due only to
            # the connections whose snapshot read held it up would leave the others with the
            # change missed), and for a change of any kind, as a resync's.
            only.pop(uid, None)
            add_change(self.changes, uid, ANY_CHANGE)
        self.resyncing.request(again)
        self._wake.set()

    def watched(self, connection: Connection, user_ids: Iterable[UserId]) -> None:
        """``connection`` subscribed to these users (Hub.watch, before their snapshot is read):
        those of the round under way, which it had unsubscribed from meanwhile, are compared
        with their new snapshot after it, not sent the round's reading (maybe older)."""
        in_flight = self.in_flight
        if in_flight:
            self.rewatched.update((uid, connection) for uid in user_ids if uid in in_flight)

    def forget(self, user_ids: Iterable[UserId]) -> None:
        """Nobody here watches these users any more: nothing of them is due."""
        for uid in user_ids:
            self.pending.pop(uid, None)
            self.delivered_at.pop(uid, None)
            self.changes.pop(uid, None)
            # A delivery due only to connections that left them must not take the next one
            # (a resync's) from those who watch them later.
            self.only.pop(uid, None)
            self.after_snapshots.pop(uid, None)
            self.after_changes.pop(uid, None)

    def settle_point(self, connection: Connection, proof: Proof) -> None:
        """``proof``'s probe is back: every announcement sent before it has reached
        :meth:`changed`. The connection's users with a delivery still to come wait for it: those
        pending (unless only for others), being resynced or waiting for its snapshot read (a
        later round), and those of the round under way (that round or a later one)."""
        if self.proofs.get(connection) is not proof:
            return  # the connection left, or asked again since
        later = self.rounds + 1
        waiting: dict[UserId, int] = {}
        pending, only, resyncing = self.pending, self.only, self.resyncing.waiting
        for uid in self.registry.watchers.of.get(connection, ()):
            ours = uid in pending and (uid not in only or connection in only[uid])
            if ours or uid in resyncing or connection in self.after_snapshots.get(uid, ()):
                waiting[uid] = later
            elif connection in self.in_flight.get(uid, ()):
                waiting[uid] = self.rounds
        proof.waiting = waiting

    def _settled(self, round_: int, delivered: list[tuple[Connection, UserId]]) -> None:
        """Round ``round_`` delivered these users to these connections (a diff, or none
        needed): they no longer hold up a proof that waited for this round or an earlier one."""
        proofs = self.proofs
        for connection, uid in delivered:
            proof = proofs.get(connection)
            if proof is not None and proof.waiting and proof.waiting.get(uid, round_ + 1) <= round_:
                del proof.waiting[uid]

    async def deliver(self, user_ids: Iterable[UserId]) -> None:
        """Resolve these users for every viewer subscribed to them here; send the diffs."""
        members = self.registry.watchers.members
        watchers: dict[UserId, list[Connection]] = {}
        # A user due without a change of known kind (a resync) is every viewer's.
        changes: dict[UserId, Change] = {}
        for uid in user_ids:
            # Taken now, before any await: a change arriving meanwhile is everyone's again.
            changes[uid] = self.changes.pop(uid, ANY_CHANGE)
            only = self.only.pop(uid, None)
            connections = [c for c in members.get(uid, ()) if only is None or c in only]
            if connections:
                watchers[uid] = connections
        if not watchers:
            return
        self.rounds += 1
        round_ = self.rounds
        self.in_flight = watchers
        self.rewatched.clear()
        try:
            await self._deliver(watchers, round_, changes)
        except BaseException:
            self._keep(changes)  # delivered again (Delivery._deliver_now)
            raise
        finally:
            self.in_flight = {}
            self.rewatched.clear()

    def _keep(self, changes: dict[UserId, Change]) -> None:
        """Changes taken for a delivery that did not happen: due again with the next (not
        those of users unsubscribed from meanwhile: nothing of them is due, see forget)."""
        watched = self.registry.watchers.members
        for uid, change in changes.items():
            if uid in watched:
                add_change(self.changes, uid, change)

    async def _deliver(
        self,
        watchers: dict[UserId, list[Connection]],
        round_: int,
        changes: dict[UserId, Change],
    ) -> None:
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
        resolved = await lifecycle.apresence_for_viewers(
            {uid: {c.viewer_id for c in connections} for uid, connections in watchers.items()}
        )
        if resolved is None:
            # Redis is unavailable: nothing is guessed; these users are tried again later.
            retry_at = next_tick(after=get_settings().RETRY_INTERVAL)  # on the grid too
            for uid in watchers:
                # Not those unsubscribed from meanwhile (forget): their retry would record a
                # delivery of a user nobody here watches, kept for good.
                if uid in self.registry.watchers.members:
                    self.pending.setdefault(uid, retry_at)
            self._keep(changes)
            return
        outbox: dict[Connection, dict[UserId, Presence]] = {}
        proofs = self.proofs
        settled: list[tuple[Connection, UserId]] = []
        # Subscribed to again during the read: compared with that snapshot once it is read.
        rewatched = self.rewatched
        for uid, connections in watchers.items():
            for connection in connections:
                if (
                    (uid, connection) in reading
                    or uid in connection.snapshotting
                    or (rewatched and (uid, connection) in rewatched)
                ):
                    self.after_snapshots.setdefault(uid, set()).add(connection)
                    add_change(self.after_changes, uid, changes[uid])
                    continue
                if proofs and connection in proofs:
                    settled.append((connection, uid))
                if uid not in connection.sent:
                    continue  # the connection unsubscribed meanwhile
                by_viewer = resolved.get(uid)
                # A user deleted meanwhile is no one: offline, nothing shown (a last diff).
                presence = HIDDEN if by_viewer is None else by_viewer.get(connection.viewer_id)
                if presence is None:
                    continue
                before = connection.sent[uid]
                if before is None and not resolved.sees(uid, connection.viewer_id, changes[uid]):
                    # Its view is the page's, which this change cannot have altered: telling
                    # it anything would tell a viewer who may not see it that it happened.
                    continue
                if visibly_differs(before, presence):
                    connection.sent[uid] = presence
                    outbox.setdefault(connection, {})[uid] = presence
        if self.after_snapshots:
            self._wake.set()  # the delivery loop looks for the end of those reads
        await self.sending.send(outbox, lambda c: _send_diff(c, outbox[c]), "a diff")
        if settled:
            # A fresh stamp goes out once the connection's diffs did (Hub.proven).
            self._settled(round_, settled)

    def _snapshots_read(self) -> bool:
        """Users a delivery skipped for connections reading their snapshot: due again for the
        connections whose read is over, and for those alone (the other watchers had the
        delivery: in a storm of openings thousands of reads end one after another, and
        resolving a user for all its watchers at each end fed the storm). True while some
        reads go on (they are looked at again)."""
        watchers = self.registry.watchers.members
        read: dict[UserId, set[Connection]] = {}
        #: the kinds of the changes those deliveries were of
        again: dict[UserId, Change] = {}
        for uid, connections in list(self.after_snapshots.items()):
            watching = watchers.get(uid, ())
            done = {c for c in connections if uid not in c.snapshotting or c not in watching}
            if not done:
                continue
            still = connections - done
            change = self.after_changes.get(uid, ANY_CHANGE)
            if still:
                self.after_snapshots[uid] = still
            else:
                del self.after_snapshots[uid]
                self.after_changes.pop(uid, None)
            done = {c for c in done if c in watching}
            if done:
                read[uid] = done
                again[uid] = change
        fresh = []
        for uid, connections in read.items():
            if uid not in self.pending:
                fresh.append(uid)
            else:
                add_change(self.changes, uid, again[uid])
                if uid in self.only:
                    self.only[uid] |= connections  # else a delivery to everyone is coming
        for uid in fresh:
            self.changed([uid], change=again[uid])
        for uid in fresh:
            self.only[uid] = read[uid]
        return bool(self.after_snapshots)

    async def run(
        self,
        deliver: Callable[[list[UserId]], Awaitable[None]],
        running: Callable[[], bool],
    ) -> None:
        """Deliver the due users with ``deliver`` (Hub.deliver) while ``running()``."""
        # The hub's database reads get a thread (and a database connection) of their own: a
        # delivery does not queue behind the queries of sockets and pages, which share one.
        async with ThreadSensitiveContext():
            try:
                await self._rounds(deliver, running)
            finally:
                # The thread ends with the context; its connection must not outlive it open.
                with contextlib.suppress(Exception):
                    await asyncio.shield(sync_to_async(databases.close_all)())

    async def _rounds(
        self,
        deliver: Callable[[list[UserId]], Awaitable[None]],
        running: Callable[[], bool],
    ) -> None:
        loop = asyncio.get_running_loop()
        resyncing = self.resyncing
        watchers = self.registry.watchers.members
        reads_looked_at = 0.0
        while running():
            now = loop.time()
            reads_go_on = bool(self.after_snapshots)
            if reads_go_on and now >= reads_looked_at + SNAPSHOT_POLL:
                # Not at every round: in a storm thousands of users may wait for reads.
                reads_looked_at = now
                reads_go_on = self._snapshots_read()
            # At most DELIVER_BATCH at a time (the rest stay due: the next round takes them at
            # once), live changes before any chunk of a resync.
            due = list(
                itertools.islice(
                    (uid for uid, at in self.pending.items() if is_due(at, now)), DELIVER_BATCH
                )
            )
            if resyncing.may_run(now, live_due=bool(due)):
                chunk = resyncing.take(watchers.__contains__)
                started = loop.time()
                await self._deliver_now(deliver, chunk, loop)
                resyncing.spent(started, loop.time())
                continue
            if due:
                window_ends = [self.pending.pop(uid) for uid in due]
                # At most once per window: a change after this tick waits for a later one.
                self.delivered_at.update(zip(due, window_ends, strict=True))
                await self._deliver_now(deliver, due, loop)
                metrics.delivered(window_ends, loop.time(), get_settings().COALESCE_WINDOW)
                continue
            wake_at = min(
                (
                    at
                    for at in (
                        resyncing.wake_at(),
                        min(self.pending.values(), default=None),
                        reads_looked_at + SNAPSHOT_POLL if reads_go_on else None,
                    )
                    if at is not None
                ),
                default=None,
            )
            self._wake.clear()
            if wake_at is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, wake_at - now))

    async def _deliver_now(
        self,
        deliver: Callable[[list[UserId]], Awaitable[None]],
        user_ids: list[UserId],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        if not user_ids:
            return
        try:
            await deliver(user_ids)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The database failed (a connection terminated, a failover): these users are
            # delivered again after RETRY_INTERVAL, on a fresh connection.
            logger.exception("Presence: delivering live updates failed; retrying shortly")
            retry_at = next_tick(after=get_settings().RETRY_INTERVAL)  # on the grid too
            for uid in user_ids:
                if uid in self.registry.watchers.members:
                    self.pending.setdefault(uid, retry_at)
            with contextlib.suppress(Exception):
                await sync_to_async(close_old_connections)()
