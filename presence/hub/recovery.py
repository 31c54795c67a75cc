"""What the hub does after something went wrong: an outage of presence's Redis, failed calls
to the channel layer, announcements arriving too late. Each time the users whose changes may
have gone unheard are resolved again (the sweep loop calls these, presence.hub.tasks), paced
below the live work (presence.hub.delivery.ResyncPace)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from presence import announce, metrics
from presence.conf import get_settings
from presence.domain import UserId
from presence.hub.groups import Groups
from presence.hub.registry import Registry
from presence.store import get_store

logger = logging.getLogger("presence")

#: a process behind its channel has caught up once announcements reach it within this share of
#: behind_after() (or none came for a sweep interval): a quarter, 3.75 s with channels_redis's
#: default expiry
CAUGHT_UP = 0.25
#: a process behind again within this many seconds of its catch-up resync had not caught up:
#: the next catch-up waits for twice the quiet (up to QUIET_MAX sweep intervals)
RELAPSE = 60.0
QUIET_MAX = 32


class Recovery:
    """Resyncs after Redis outages, channel-layer failures and lag."""

    def __init__(
        self,
        layer: Any,
        registry: Registry,
        groups: Groups,
        resync: Callable[[Iterable[UserId]], None],
    ) -> None:
        self.layer = layer
        self.registry = registry
        self.groups = groups
        #: Delivery.resync: these users are resolved again, in chunks paced below the live
        #: work (a resync of every watched user must not feed the lag it recovers from)
        self.resync = resync
        #: outages of presence's Redis that ended, when last looked at (see after_outages)
        self._recoveries_seen = get_store().recoveries()
        #: announce.layer_failures when last looked at, and when to rejoin every group
        self._failures_seen = announce.layer_failures
        self._rejoin_all_at: float | None = None
        #: announcements reach this process so late that some may be lost (see note_lag)
        self.behind = False
        #: loop time of the last announcement that came too late
        self._last_late = 0.0
        #: how late the latest announcement arrived, seconds (the health endpoint shows it)
        self.lag: float | None = None
        #: sweep intervals without a late announcement that count as caught up (see note_lag)
        self._quiet_needed = 1
        #: loop time of the last catch-up resync, and how many there were (the rooms' views
        #: are read again after each: presence.hub.rooms.RoomViews.sweep)
        self._resynced_at: float | None = None
        self.catch_ups = 0

    def _resync(self) -> None:
        self.resync(list(self.registry.watchers.members))

    def after_outages(self) -> None:
        """When an outage of presence's Redis ended, resolve every watched user again:
        changes during it (a tab closed, a connection that expired) were not announced."""
        recoveries = get_store().recoveries()
        if recoveries != self._recoveries_seen:
            self._recoveries_seen = recoveries
            self._resync()

    def after_layer_failures(self, now: float) -> None:
        """RETRY_INTERVAL after the last failed channel-layer call of this process, every
        group it wants is joined again (every watched user's, then resolved again, and the
        accounts', topics' and rooms'): a layer server that failed may have lost messages, or
        come back empty (the core layer's groups are keys in it)."""
        if announce.layer_failures != self._failures_seen:
            self._failures_seen = announce.layer_failures
            self._rejoin_all_at = now + get_settings().RETRY_INTERVAL
        elif self._rejoin_all_at is not None and now >= self._rejoin_all_at:
            self._rejoin_all_at = None
            self.groups.unjoined.update(self.registry.watchers.members)
            # A topic's group, say the feed's, is joined by its kind's first connection only:
            # lost with the server, nothing else would ever join it again here.
            self.groups.unjoined_groups.update(self.registry.other_groups())
            self.groups.forget_lingering()

    async def rejoin(self) -> None:
        """Join the groups a failed group_add left out, and resolve those users again: their
        changes meanwhile did not reach this process. (What a topic's or room's group missed
        meanwhile is not sent again: the rooms' views are read again after a layer failure,
        presence.hub.rooms.RoomViews.sweep.)"""
        await self.groups.join_again()
        watchers = self.registry.watchers.members
        retry = [uid for uid in self.groups.unjoined if uid in watchers]
        self.groups.unjoined.clear()
        if not retry:
            return
        failed = set(await self.groups.join_users(retry))
        self.resync([uid for uid in retry if uid not in failed])

    def behind_after(self) -> float:
        """How late (seconds after it was sent) an announcement may reach this process before
        the process counts as behind its channel: a quarter of the layer's message expiry
        (channels_redis drops messages older than it, 60 s by default, and any message sent to
        a full channel)."""
        return float(getattr(self.layer, "expiry", 60)) / 4

    def note_lag(self, sent: Any) -> None:
        """An announcement sent at ``sent`` arrived now. A process that cannot keep up with its
        channel receives announcements later and later, and past the layer's expiry or its
        capacity they are dropped without a word: views would stay wrong until the user's next
        change. Once it has caught up (see after_lag), every watched user is resolved again."""
        if not isinstance(sent, (int, float)) or isinstance(sent, bool):
            return  # a message of an older version
        lag = self.lag = time.time() - sent
        metrics.HUB_LAG.set(lag)
        if lag < self.behind_after():
            if self.behind and lag >= self.behind_after() * CAUGHT_UP:
                # Still far behind, if less than before: not caught up yet. In a storm the lag
                # swings about the limit; each swing below it resynced every watched user,
                # and that work kept the process behind (issue 28).
                self._last_late = asyncio.get_running_loop().time()
            return
        now = asyncio.get_running_loop().time()
        if not self.behind:
            if self._resynced_at is not None and now - self._resynced_at < RELAPSE:
                # Behind again right after a resync: the quiet that looked like a drained
                # channel was a loop too busy to read it. Wait for a longer quiet next time.
                self._quiet_needed = min(self._quiet_needed * 2, QUIET_MAX)
            else:
                self._quiet_needed = 1
            logger.warning(
                "Presence: announcements reach this process %.0f s after they were sent: it is "
                "behind its channel, and the channel layer may drop some (its expiry, a full "
                "channel). Every watched user is resolved again once it has caught up; see the "
                "deployment docs on sizing.",
                lag,
            )
        self.behind = True
        self._last_late = now

    def after_lag(self, now: float) -> None:
        """Caught up (for a whole sweep interval no announcement later than CAUGHT_UP of the
        limit; twice as long after each relapse, see note_lag): every watched user is resolved
        again, once, since changes announced while behind may have been dropped."""
        quiet = get_settings().SWEEP_INTERVAL * self._quiet_needed
        if self.behind and now - self._last_late >= quiet:
            self.behind = False
            self._resynced_at = now
            self.catch_ups += 1
            logger.warning("Presence: this process caught up with its channel; resyncing views.")
            self._resync()
