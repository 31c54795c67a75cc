"""The :class:`Hub`: one per process (per event loop), composed of the modules of this package."""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from channels.layers import get_channel_layer

from presence import announce, metrics
from presence.domain import ANY_CHANGE, Change, UserId
from presence.hub.counts import OnlineCounts
from presence.hub.delivery import Delivery, Proof
from presence.hub.groups import Groups
from presence.hub.messages import PROBE, Messages
from presence.hub.recovery import Recovery
from presence.hub.registry import Connection, Registry
from presence.hub.rooms import RoomViews
from presence.hub.tasks import Tasks
from presence.layer import CORE_LAYER, PUBSUB_LAYER, layer_kind, probe_group_name
from presence.store import get_store

#: a probe not back this many seconds after it was sent goes again, this many times at most, on
#: a pub/sub layer: a message published before the hub's subscription to its probe group is in
#: place (it is sent on another connection than the publish) is never delivered
PROBE_RESEND_AFTER = 1.0
PROBE_RESENDS = 3
#: seconds a probe sent may be shared by the connections probing after it (one group_send for
#: the fresh stamps of a heartbeat's moment, not one each)
PROBE_SHARED = 1.0

_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def ordered(layer: Any) -> bool:
    """Whether the channel layer hands a channel its messages in the order they were sent,
    whoever sent them: channels_redis's core layer keeps each channel's messages in one sorted
    set (scored by the senders' clocks, STAMP_SLACK apart at most), its pub/sub layer on one
    server delivers in publish order; over several pub/sub servers a user's group and the hub's
    channel may be on different servers, with no order between them."""
    kind = layer_kind(layer)
    if kind == PUBSUB_LAYER:
        return len(getattr(layer, "_shards", ())) == 1
    return kind in _ORDERED


def _unconfirmed_subscriptions(layer: Any) -> bool:
    """Whether joining a group may return before the layer receives the group's messages:
    channels_redis's pub/sub layer sends SUBSCRIBE without waiting for Redis to confirm it."""
    return layer_kind(layer) == PUBSUB_LAYER


#: channel layers whose channels are first in, first out
_ORDERED = frozenset({CORE_LAYER, "channels.layers.InMemoryChannelLayer"})


class Hub:
    """The process's (event loop's) live connections, their subscriptions and the channel
    layer: what consumers and topic deliveries (extensions.Topics) call."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.registry = Registry()
        self.groups = Groups(self.layer, self.registry)
        self.delivery = Delivery(self.registry)
        # The room frames and the online count go through the diffs' sending: one queue per
        # connection for all the hub's frames (their order kept, none held by a slow client).
        self.rooms = RoomViews(self.registry, self.groups, self.delivery.sending)
        # Through the instance when called, not bound now: a benchmark wraps changed and
        # deliver on a hub (benchmarks/bench_fanout.py) and must see every call.
        self.recovery = Recovery(
            self.layer, self.registry, self.groups, resync=lambda uids: self.resync(uids)
        )
        self.messages = Messages(
            self.registry,
            topics=self,
            changed=lambda uids, announced_at, change: self.changed(
                uids, announced_at=announced_at, change=change
            ),
            note_lag=self.recovery.note_lag,
            rooms=self.rooms,
            probed=self._probed,
        )
        #: probes sent to this hub's own channel and not back yet: id -> each connection it
        #: proves for, with its proof (connections probing within PROBE_SHARED share one)
        self._probes: dict[int, dict[Connection, Proof]] = {}
        #: the last probe sent, which a connection probing within PROBE_SHARED seconds of its
        #: time shares: its id and proof (the time it claims and the recovery counters then: a
        #: failure since voids it for all)
        self._shared_probe: tuple[int, Proof] | None = None
        self._probe_ids = itertools.count()
        #: the group of this hub's channel alone that probes go through, once joined, and when
        #: to join it again (the layer's groups expire)
        self._probe_group: str | None = None
        self._probe_renew_at = 0.0
        #: announce.layer_failures when the probe group was last joined: a failure since may
        #: mean its server came back empty (the core layer's groups are keys in it)
        self._probe_joined_after = announce.layer_failures
        #: re-sends of probes under way (held: a task only the loop refers to may be collected)
        self._probe_resends: set[asyncio.Task[None]] = set()
        self.tasks = Tasks(
            self.registry,
            self.groups,
            self.delivery,
            self.recovery,
            self.messages,
            self.rooms,
            deliver=lambda uids: self.deliver(uids),
            dispatch=lambda message: self.dispatch(message),
        )
        #: the connections watching the site's online count, and its one reading
        self.counts = OnlineCounts(self.delivery.sending)
        #: attach and detach: the hub starts and stops under it
        self._lock = asyncio.Lock()

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
        try:
            await self._attach(connection)
        except BaseException:
            # Cancelled (the server gave up on the socket) or failed on the way: the connection
            # is in the registry already, and its consumer, not attached, will not detach it.
            # Shielded: a second cancellation must not leave it there either.
            await asyncio.shield(self.detach(connection))
            raise

    async def _attach(self, connection: Connection) -> None:
        first_socket = False
        joining = None
        accounts = self.registry.accounts
        group = accounts.group(connection.viewer_id)
        async with self._lock:
            self.registry.connections.add(connection)
            if not self.tasks.running:
                await self.tasks.start()
            if connection.credential is not None:
                first_socket = accounts.add(connection, connection.viewer_id)
                # Another socket's join may still be on its way to the layer.
                joining = None if first_socket else self.groups.joining(group)
        if first_socket:
            # Outside the lock (a storm of connections must not join one at a time); its turn
            # is taken at once, so a leave decided later runs after it.
            await self.groups.join(group)
        elif joining is not None:
            await asyncio.shield(joining)

    async def detach(self, connection: Connection) -> None:
        # First out of the registry: a handler of this connection still running (or a frame
        # racing the close) can no longer watch anything for it.
        self.registry.connections.discard(connection)
        self.counts.discard(connection)
        # Frames still queued for it (diffs, room frames, counts) go nowhere (nor keep a task
        # waiting on a closed client).
        self.delivery.sending.drop(connection)
        # Its groups linger (Groups.let_go): the next page's socket needs most of them again.
        await self._unwatched(self.registry.watchers.discard_all(connection), linger=True)
        for kind in self.registry.topics.kinds_of(connection):
            for key in self.registry.topics.keys_of(connection, kind):
                await self.leave_topic(connection, kind, key)
        await self.rooms.detach(connection)
        if self.delivery.proofs.pop(connection, None) is not None:
            for probe_id, probing in list(self._probes.items()):
                if probing.pop(connection, None) is not None and not probing:
                    self._probe_failed(probe_id)  # nobody waits for it: not resent
        async with self._lock:
            accounts = self.registry.accounts
            if accounts.discard(connection, connection.viewer_id):
                self.groups.let_go([accounts.group(connection.viewer_id)])
            if not self.registry.connections and self.tasks.running:
                if self._probe_group is not None:
                    await self.groups.leave(self._probe_group)
                    self._probe_group = None
                await self.tasks.stop()

    async def watch(self, connection: Connection, user_ids: Iterable[UserId]) -> None:
        if connection not in self.registry.connections:
            return  # detached meanwhile (closed by the server while its frame was handled)
        watchers = self.registry.watchers
        user_ids = list(user_ids)
        self.delivery.watched(connection, user_ids)
        first = watchers.add_all(connection, user_ids)
        joining: list[asyncio.Future[None]] = []
        if self.groups.in_turns():
            new = set(first)
            for user_id in user_ids:
                if user_id in new:
                    continue
                if (turn := self.groups.joining(watchers.group(user_id))) is not None:
                    # Another connection's join of this group is still on its way to the
                    # layer: a snapshot read before it lands could miss a change announced
                    # meanwhile.
                    joining.append(turn)
        metrics.WATCHED_USERS.inc(len(first))
        await self.groups.join_users(first)
        if joining:
            await asyncio.gather(*(asyncio.shield(turn) for turn in joining))

    async def unwatch(
        self, connection: Connection, user_ids: Iterable[UserId], linger: bool = False
    ) -> None:
        watchers = self.registry.watchers
        last = [uid for uid in user_ids if watchers.discard(connection, uid)]
        await self._unwatched(last, linger)

    async def _unwatched(self, last: list[UserId], linger: bool) -> None:
        """Nobody here watches these users any more: nothing to deliver, nothing to rejoin;
        their groups are left (or linger)."""
        never_joined = []
        unjoined = self.groups.unjoined
        self.delivery.forget(last)
        for user_id in last:
            if user_id in unjoined:
                unjoined.discard(user_id)
                never_joined.append(user_id)
        metrics.WATCHED_USERS.dec(len(last))
        if linger:
            # A group whose join failed is left now (it may have reached the layer), not kept.
            self.groups.let_go_users([uid for uid in last if uid not in never_joined])
            last = never_joined
        await self.groups.leave_users(last)

    async def join_topic(self, connection: Connection, kind: str, key: str) -> None:
        """Give ``connection`` the topic ``key`` of ``kind``; this process then receives
        what is announced to ``kind`` (presence.extensions)."""
        if connection not in self.registry.connections:
            return  # detached: a handler still running must not add anything for it
        group = self.registry.topics.group(kind)
        if self.registry.topics.add(connection, kind, key):
            await self.groups.join(group)
        elif (joining := self.groups.joining(group)) is not None:
            # Another connection's join is still on its way to the layer: what is announced
            # to the kind before it lands does not reach this process.
            await asyncio.shield(joining)

    async def leave_topic(self, connection: Connection, kind: str, key: str) -> None:
        if self.registry.topics.discard(connection, kind, key):
            await self.groups.leave(self.registry.topics.group(kind))

    def topics_of(self, connection: Connection, kind: str) -> set[str]:
        """The keys of ``kind`` that ``connection`` has (a copy)."""
        return self.registry.topics.keys_of(connection, kind)

    def topic_members(self, kind: str) -> dict[Connection, set[str]]:
        """Every local connection with topics of ``kind``, and its keys (copies)."""
        return self.registry.topics.members_of(kind)

    async def send_in_order(
        self,
        connections: Iterable[Connection],
        send: Callable[[Connection], Awaitable[None]],
        what: str,
    ) -> None:
        """``await send(connection)`` for each of ``connections`` through the hub's one queue
        per connection (presence.hub.sends.InOrder, which the diffs, room frames and counts go
        through): after the frames asked for that connection before, in order, and a client
        that reads nothing holds up only its own. Returns without waiting for a held send;
        ``send`` runs when the connection's turn comes, so it looks again at what the
        connection still wants then. A send that fails (a connection closing) is logged at
        debug level as ``what``; a connection that closes drops what still waits for it."""
        await self.delivery.sending.send(connections, send, what)

    # --- changes and announcements ---

    def changed(
        self,
        user_ids: Iterable[UserId],
        announced_at: float | None = None,
        change: Change = ANY_CHANGE,
    ) -> None:
        """Users whose presence may have changed, in ``change``'s way: delivered at the grid's
        next tick (see Delivery.changed)."""
        self.delivery.changed(user_ids, announced_at, change)

    def resync(self, user_ids: Iterable[UserId]) -> None:
        """Users to resolve again below the live work, in paced chunks (Delivery.resync)."""
        self.delivery.resync(user_ids)

    async def deliver(self, user_ids: Iterable[UserId]) -> None:
        """Resolve these users for every viewer subscribed to them here; send the diffs."""
        await self.delivery.deliver(user_ids)

    # --- fresh stamps (docs/websocket.md, "Fresh stamps") ---

    def _counters(self) -> tuple[object, ...]:
        """What changes when an announcement may have been lost: an outage of Redis ended, a
        channel-layer call failed, the process caught up with its channel (a resync each)."""
        return (get_store().recoveries(), announce.layer_failures, self.recovery.catch_ups)

    async def probe(self, connection: Connection) -> Proof:
        """Start proving that every change announced before now has been delivered to
        ``connection`` (:class:`Proof`; ask :meth:`proven` later). A probe goes to this hub's
        own channel (through a group of it alone: presence.layer.probe_group_name), behind
        every announcement already sent to it (the channel is first in, first out), and comes
        back through the receive loop to :meth:`_probed`. Without a channel layer,
        announcements reach the hub as they are made: it is back at once."""
        proof = Proof(time.time(), self._counters())
        self.delivery.proofs[connection] = proof
        layer, channel = self.layer, self.groups.channel
        if layer is None:
            self.delivery.settle_point(connection, proof)
            return proof
        if channel is None or not ordered(layer):
            return proof  # never back: never proven
        shared = self._shared_probe
        if shared is not None and 0 <= proof.at - shared[1].at < PROBE_SHARED:
            # A probe sent a moment ago proves every change announced before its own time:
            # this connection's claim is that time (a fresh stamp's a moment older), and one
            # probe goes for the connections of a heartbeat's moment (a storm's thousands).
            probe_id, first = shared
            proof = Proof(first.at, first.counters)
            self.delivery.proofs[connection] = proof
            riders = self._probes.get(probe_id)
            if riders is not None:
                riders[connection] = proof
            else:
                # Back already: what it proves has reached the hub, pending or delivered.
                self.delivery.settle_point(connection, proof)
            return proof
        probe_id = next(self._probe_ids)
        self._probes[probe_id] = {connection: proof}
        self._shared_probe = (probe_id, proof)
        group = probe_group_name(channel)
        now = asyncio.get_running_loop().time()
        failures = announce.layer_failures
        if (
            self._probe_group != group
            or now >= self._probe_renew_at
            or failures != self._probe_joined_after
        ):
            # The hub's own group, joined at its first probe, renewed before the layer's
            # group expiry ends it and after a layer call failed, left when the hub stops
            # (detach).
            try:
                await self.groups.join(group)
            except BaseException:
                self._probe_failed(probe_id)
                raise
            self._probe_group = group
            self._probe_joined_after = failures
            self._probe_renew_at = now + float(getattr(self.layer, "group_expiry", 86400)) / 2
        resends = PROBE_RESENDS if _unconfirmed_subscriptions(layer) else 0
        await self._send_probe(probe_id, group, resends)
        return proof

    def _probe_failed(self, probe_id: int) -> None:
        """Probe ``probe_id`` will not come back: no proof for its connections now (a later
        heartbeat probes again), and none may ride on it."""
        self._probes.pop(probe_id, None)
        if self._shared_probe is not None and self._shared_probe[0] == probe_id:
            self._shared_probe = None

    async def _send_probe(self, probe_id: int, group: str, resends: int) -> None:
        """Send probe ``probe_id`` (again); while ``resends`` are left, look again a little
        later and send it once more if it is not back. The same probe back twice is back once
        (:meth:`_probed`), and a later copy still comes behind every announcement sent before
        the proof's time."""
        if probe_id not in self._probes:
            return  # back meanwhile, or its connection gone
        try:
            message = {"type": PROBE, "probe": probe_id}
            await announce.layer_call(self.layer.group_send, group, message)
        except Exception:
            self._probe_failed(probe_id)  # counted as a layer failure
            return
        if resends > 0:
            asyncio.get_running_loop().call_later(
                PROBE_RESEND_AFTER, self._resend_probe, probe_id, group, resends - 1
            )

    def _resend_probe(self, probe_id: int, group: str, resends: int) -> None:
        if probe_id in self._probes:
            task = asyncio.ensure_future(self._send_probe(probe_id, group, resends))
            self._probe_resends.add(task)
            task.add_done_callback(self._probe_resends.discard)

    def _probed(self, message: dict[str, Any]) -> None:
        found = self._probes.pop(message.get("probe"), None)  # type: ignore[arg-type]
        for connection, proof in (found or {}).items():
            self.delivery.settle_point(connection, proof)

    def proven(self, connection: Connection, proof: Proof) -> bool:
        """Whether every change announced before ``proof.at`` has been delivered to
        ``connection``: its probe is back, what waited has been delivered, and nothing since
        the probe says an announcement may have been lost (this process is not behind its
        channel, no outage ended, no layer call failed). True once: the proof is then forgotten
        (deliveries to the connection no longer note anything for it)."""
        proofs = self.delivery.proofs
        if proofs.get(connection) is not proof or not proof.proven(connection):
            return False
        if self.delivery.sending.busy(connection):
            return False  # a diff of the round that settled it may not be out yet
        if proof.counters != self._counters() or self.recovery.behind:
            return False
        del proofs[connection]
        return True

    def dispatch(self, message: dict[str, Any]) -> None:
        """Act on one message announced through :mod:`presence.announce`."""
        self.messages.dispatch(message)

    def behind_after(self) -> float:
        """How late an announcement may arrive before this process counts as behind its
        channel (see Recovery.behind_after)."""
        return self.recovery.behind_after()

    async def _stop(self) -> None:
        """Stop the background tasks (detach does when the last connection leaves)."""
        await self.tasks.stop()
