"""The hub's background tasks while it has connections: the receive loop on its channel, the
delivery loop (presence.hub.delivery) and the sweep loop; and the sweeps that go on for a
while after the last connection left."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from presence import announce, lifecycle
from presence.conf import get_settings
from presence.domain import UserId
from presence.hub import inbox
from presence.hub.delivery import TICK, Delivery
from presence.hub.groups import Groups
from presence.hub.messages import Messages
from presence.hub.recovery import Recovery
from presence.hub.registry import Registry
from presence.hub.rooms import RoomViews

logger = logging.getLogger("presence")


class Tasks:
    """Starts and stops the hub's loops; each loop ends by itself once it is no longer one of
    :attr:`running` (a cancellation can be swallowed)."""

    def __init__(
        self,
        registry: Registry,
        groups: Groups,
        delivery: Delivery,
        recovery: Recovery,
        messages: Messages,
        rooms: RoomViews,
        *,
        deliver: Callable[[list[UserId]], Awaitable[None]],
        dispatch: Callable[[dict[str, Any]], None],
    ) -> None:
        self.layer = groups.layer
        self.registry = registry
        self.groups = groups
        self.delivery = delivery
        self.recovery = recovery
        self.messages = messages
        #: Hub.deliver and Hub.dispatch
        self.deliver = deliver
        self.dispatch = dispatch
        self.running: list[asyncio.Task[None]] = []
        #: the hub's rooms (presence.hub.rooms): their delivery loop and sweep
        self.rooms = rooms
        #: the sweeps that go on after the last connection left (see _linger_sweeps)
        self.lingering: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.lingering is not None:
            self.lingering.cancel()
            self.lingering = None
        if self.layer is not None:
            self.groups.channel = await inbox.new_channel(self.layer)
            logger.info("Presence: the live hub listens on channel %s.", self.groups.channel)
        self.running = [
            asyncio.ensure_future(self.delivery.run(self.deliver, self._owns_current_task)),
            asyncio.ensure_future(self._sweep_loop()),
        ]
        if self.layer is not None:
            self.running.append(asyncio.ensure_future(self._receive_loop()))
        if get_settings().ROOMS:
            self.running.append(asyncio.ensure_future(self.rooms.run(self._owns_current_task)))
            rules = self.rooms.rules
            self.running.append(asyncio.ensure_future(rules.run(self._owns_current_task)))
            counts = self.rooms.counts
            self.running.append(asyncio.ensure_future(counts.run(self._owns_current_task)))

    async def stop(self) -> None:
        tasks, self.running = self.running, []
        tasks += list(self.messages.delivering)
        tasks += list(self.rooms.rules.asked)
        tasks += list(self.rooms.counts.asked)
        self.delivery.pending.clear()
        self.delivery.changes.clear()
        self.delivery.resyncing.waiting.clear()
        self.delivery.after_snapshots.clear()
        self.delivery.after_changes.clear()
        self.delivery.proofs.clear()
        # Groups connections still leaving hold (they left the registry, the last of them
        # stopped the hub, and they wait for the lock) are left now, while the hub still has
        # its channel: nothing of this process stays in the layer.
        await self.groups.leave_users(list(self.registry.watchers.members))
        for group in self.registry.other_groups():
            await self.groups.leave(group)
        await self.groups.leave_lingering()
        self.groups.channel = None
        # The users who were connected here turn offline after their grace even if no
        # connection opens here again (nor anywhere): this process sweeps on for a while.
        self.lingering = asyncio.ensure_future(self._linger_sweeps())
        for task in tasks:
            task.cancel()
        # Not waited for: a channel-layer receive can swallow its cancellation (channels_redis
        # with redis-py) and block until its BZPOPMIN times out (5 s), which would hold up this
        # close and every new connection (they wait on the hub's lock). Such a receive loop
        # ends by itself, its channel being gone; one more cancel usually ends it at once.
        if tasks:
            _, lingering = await asyncio.wait(tasks, timeout=TICK)
            for task in lingering:
                task.cancel()

    def _owns_current_task(self) -> bool:
        # A cancellation can be swallowed (sync_to_async waits for its thread and returns its
        # result): a loop whose hub stopped must end by itself.
        return asyncio.current_task() in self.running

    async def _linger_sweeps(self) -> None:
        """Sweep every SWEEP_INTERVAL for CONNECTION_TTL + OFFLINE_GRACE after the last
        connection left: by then every user connected here is offline and out of the due
        schedule, even if this was the last process with connections."""
        conf = get_settings()
        loop = asyncio.get_running_loop()
        until = loop.time() + conf.CONNECTION_TTL + conf.OFFLINE_GRACE + 2 * conf.SWEEP_INTERVAL
        while loop.time() < until and not self.running:
            await asyncio.sleep(conf.SWEEP_INTERVAL)
            if self.running:
                return  # a connection came: the hub's own sweep loop runs again
            try:
                await self._leave_again_and_sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Presence: sweeping due users failed")

    async def _leave_again_and_sweep(self) -> None:
        """Leave the groups a failed leave kept, then announce the users now due. A sweep under
        way is finished even if its loop is cancelled (the hub stopping): it gives back the
        users it claimed rather than leave them to the next sweep after its lease."""
        await self.groups.leave_again()
        await asyncio.shield(asyncio.ensure_future(lifecycle.asweep()))
        if get_settings().ROOMS:
            await self.rooms.sweep(self.recovery.catch_ups)

    async def _receive_loop(self) -> None:
        assert self.layer is not None and self.groups.channel is not None
        channel = self.groups.channel
        receive = inbox.receiver(self.layer, channel)
        while self.groups.channel == channel:  # the hub stopped (or restarted on a new channel)
            try:
                messages = await receive()
            except asyncio.CancelledError:
                raise
            except RedisTimeoutError:
                # An idle channel: the layer's blocking pop outlived the socket timeout.
                continue
            except Exception as error:
                if self.groups.channel != channel:
                    return  # a cancellation the layer turned into an error
                logger.warning("Presence: channel layer receive failed (%s); retrying.", error)
                announce.note_layer_failure()
                await asyncio.sleep(get_settings().RETRY_INTERVAL)
                continue
            for message in messages:
                if self.groups.channel != channel:
                    break
                self.dispatch(message)

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
                    await self.groups.join_users(list(self.registry.watchers.members))
                    for group in self.registry.other_groups():
                        await self.groups.join(group)
                self.recovery.after_outages()
                self.recovery.after_layer_failures(loop.time())
                self.recovery.after_lag(loop.time())
                if self.groups.unjoined or self.groups.unjoined_groups:
                    await self.recovery.rejoin()
                await self._leave_again_and_sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Presence: sweeping due users failed")
