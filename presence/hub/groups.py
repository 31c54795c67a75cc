"""The hub's membership of channel-layer groups: joins and leaves in the order decided, and
the ones the layer refused, kept to be tried again (presence.hub.recovery, the sweep)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from presence.announce import group_name, layer_call, note_layer_failure
from presence.domain import UserId
from presence.gathering import Gathering, split_as
from presence.hub.registry import Registry
from presence.layer import GroupCall, group_calls_of, groups_together

logger = logging.getLogger("presence")

#: seconds a group stays joined after the socket that needed it closed. On a site of pages every
#: page view closes its socket and the next page opens one for the same account, watching
#: mostly the same users, moments later: joining and leaving each time cost two channel-layer
#: calls per user and per account. Meanwhile the group's messages find nobody and are dropped.
LINGER = 30.0


class Groups:
    """The groups this process's channel is in, one queue of "turns" per group: a join and a
    leave of one group reach the layer in the order the hub decided them, whichever call gets
    to run first."""

    def __init__(self, layer: Any, registry: Registry) -> None:
        self.layer = layer
        self.registry = registry
        #: the process's channel in the layer while the hub runs (presence.hub.tasks)
        self.channel: str | None = None
        #: watched users whose group this process could not join (the layer's Redis was down):
        #: joined again at each sweep, then resolved again (changes meanwhile went unheard)
        self.unjoined: set[UserId] = set()
        #: the other groups (accounts', topics', rooms') whose join this process could not
        #: make, or that the layer may have lost: joined again at each sweep while still wanted
        #: (a topic's group is joined once, by its kind's first connection here)
        self.unjoined_groups: set[str] = set()
        #: group -> channel: leaves the layer refused (its Redis was down), left again at each
        #: sweep unless wanted again meanwhile (a server that comes back with its data would
        #: otherwise keep sending this process what it no longer wants)
        self.undiscarded: dict[str, str] = {}
        #: each group's last join or leave decided (they reach the layer in that order)
        self._turns: dict[str, asyncio.Future[None]] = {}
        #: group -> loop time to leave it: groups no socket here needs since one closed, kept
        #: joined for LINGER in case the next page view needs them again
        self.lingering: dict[str, float] = {}
        self._letting_go: asyncio.Task[None] | None = None
        #: the calls of one moment of the event loop, of every socket, sent together: a
        #: storm of openings joins as many account groups, each its own round trip otherwise
        self._together: Gathering[list[GroupCall], list[Exception | None]] = Gathering(
            self._send_together
        )

    def in_turns(self) -> bool:
        """Whether any join or leave is still on its way to the layer."""
        return bool(self._turns)

    def joining(self, group: str) -> asyncio.Future[None] | None:
        """The last join or leave of ``group`` still on its way to the layer, if any."""
        return self._turns.get(group)

    async def join(self, group: str) -> None:
        if self.lingering.pop(group, None) is not None:
            await self._joined_already([group])
            return
        await self._call("group_add", group)

    def _joined_already(self, groups: list[str]) -> Awaitable[Any]:
        """Done when these lingering groups' joins, maybe still on their way, have reached
        the layer (their turns as they are now)."""
        turns = [turn for group in groups if (turn := self._turns.get(group)) is not None]
        return asyncio.gather(*(asyncio.shield(turn) for turn in turns))

    def let_go(self, groups: list[str]) -> None:
        """Groups no socket here needs since one closed: left LINGER seconds from now, unless a
        socket needs them again meanwhile (then nothing reaches the layer either way)."""
        if self.channel is None or not groups:
            return
        leave_at = asyncio.get_running_loop().time() + LINGER
        for group in groups:
            self.lingering[group] = leave_at
        if self._letting_go is None or self._letting_go.done():
            self._letting_go = asyncio.ensure_future(self._leave_lingering_when_due())

    def let_go_users(self, user_ids: list[UserId]) -> None:
        """Users no socket here watches since one closed (see :meth:`let_go`)."""
        self.let_go([group_name(uid) for uid in user_ids])

    async def _leave_lingering_when_due(self) -> None:
        loop = asyncio.get_running_loop()
        while self.lingering:
            await asyncio.sleep(max(0.0, min(self.lingering.values()) - loop.time()))
            now = loop.time()
            due = [group for group, at in self.lingering.items() if at <= now]
            for group in due:
                del self.lingering[group]
            await self._leave_groups(due)

    async def leave_lingering(self) -> None:
        """Leave every lingering group now (the hub stops: nothing of it stays in the layer)."""
        task, self._letting_go = self._letting_go, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        groups, self.lingering = list(self.lingering), {}
        await self._leave_groups(groups)

    def forget_lingering(self) -> None:
        """The layer may have lost its groups (a server came back empty): lingering groups are
        no longer counted as joined; they are left at the next sweep, unless wanted again."""
        if self.channel is not None:
            self.undiscarded.update(dict.fromkeys(self.lingering, self.channel))
        self.lingering.clear()

    async def _leave_groups(self, groups: list[str]) -> None:
        channel = self.channel
        if self.layer is None or channel is None or not groups:
            return
        results = await self._in_turns(groups, "group_discard", channel)
        failed = [g for g, r in zip(groups, results, strict=True) if isinstance(r, Exception)]
        if failed:
            logger.warning(
                "Presence: channel layer group_discard failed for %d groups.", len(failed)
            )
            self.undiscarded.update(dict.fromkeys(failed, channel))

    async def leave(self, group: str) -> None:
        await self._call("group_discard", group)

    async def _call(self, method: str, group: str) -> None:
        channel = self.channel
        if self.layer is None or channel is None:
            return
        (result,) = await self._in_turns([group], method, channel)
        if isinstance(result, Exception):
            logger.warning("Presence: channel layer %s failed (%s).", method, result)
            if method == "group_discard":
                self.undiscarded[group] = channel
            else:
                self.unjoined_groups.add(group)
        elif isinstance(result, BaseException):
            raise result  # a cancellation
        elif method == "group_add":
            self.unjoined_groups.discard(group)

    async def join_users(self, user_ids: list[UserId]) -> list[UserId]:
        """Join these users' groups; the users whose join failed."""
        kept: list[str] = []
        if self.lingering:
            lingering = {uid for uid in user_ids if group_name(uid) in self.lingering}
            if lingering:
                kept = [group_name(uid) for uid in lingering]
                for group in kept:
                    del self.lingering[group]
                user_ids = [uid for uid in user_ids if uid not in lingering]
        # The others' turns are taken first (before any await), as _users says.
        joined_already = self._joined_already(kept)
        failed = await self._users("group_add", user_ids)
        await joined_already
        return failed

    async def leave_users(self, user_ids: list[UserId]) -> list[UserId]:
        """Leave these users' groups; the users whose leave failed."""
        return await self._users("group_discard", user_ids)

    async def _users(self, method: str, user_ids: list[UserId]) -> list[UserId]:
        # The channel as it is now: the hub may stop (its channel None) while this runs, when
        # the last connection leaves during another one's unwatch; the calls still complete.
        channel = self.channel
        if self.layer is None or channel is None or not user_ids:
            return []
        failed: list[UserId] = []
        error: BaseException | None = None
        # Each user's turn is taken now, before any await, in the order the hub decided: a
        # join and a leave of one group (a connection subscribing while the last watcher
        # leaves) reach the layer in that order, never the other way round. The layer's calls
        # in flight are limited by announce.layer_call.
        results = await self._in_turns(list(map(group_name, user_ids)), method, channel)
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
                watchers = self.registry.watchers.members
                self.unjoined.update(uid for uid in failed if uid in watchers)
            else:
                self.undiscarded.update((group_name(uid), channel) for uid in failed)
        return failed

    async def _in_turns(self, groups: list[str], method: str, channel: str) -> list[Any]:
        """The layer's ``method`` for each group in its turn, the turns taken in this order
        before any await; the results, exceptions among them. Once every turn before these
        has reached the layer, all of them go, with the other sockets' calls of that moment
        (one round trip per server on channels_redis's core layer,
        :func:`presence.layer.group_calls_of`)."""
        turns = [(group, *self._take_turn(group)) for group in groups]
        calls: asyncio.Future[list[Any]] | None = None
        try:
            before = [turn for _, turn, _ in turns if turn is not None]
            if before:
                await asyncio.gather(*(asyncio.shield(turn) for turn in before))
            calls = self._calls(method, groups, channel)
            # Shielded: a caller cancelled meanwhile leaves its calls on their way.
            return await asyncio.shield(calls)
        finally:
            if calls is None or calls.done():
                self._end_turns(turns)
            else:
                # The next call of these groups goes once these reached the layer.
                calls.add_done_callback(lambda _: self._end_turns(turns))

    def _calls(self, method: str, groups: list[str], channel: str) -> asyncio.Future[list[Any]]:
        if groups_together(self.layer):
            # With the other sockets' calls of this moment: a storm of openings joins as many
            # account groups, a round trip each otherwise. No two calls of one group are in
            # one batch (the second waits for the first's turn).
            return self._together.ask([(method, group, channel) for group in groups])
        call = getattr(self.layer, method)
        return asyncio.gather(
            *(layer_call(call, group, channel) for group in groups), return_exceptions=True
        )

    async def _send_together(self, batches: list[list[GroupCall]]) -> list[list[Exception | None]]:
        results = await group_calls_of(self.layer, [call for calls in batches for call in calls])
        if any(result is not None for result in results):
            note_layer_failure()
        return split_as(batches, results)

    def _end_turns(
        self, turns: list[tuple[str, asyncio.Future[None] | None, asyncio.Future[None]]]
    ) -> None:
        # (A failed batch's exception is read by the Gathering; a gather of the layer's own
        # calls returns its exceptions.)
        for group, _, mine in turns:
            self._end_turn(group, mine)

    def _take_turn(self, group: str) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """A place in ``group``'s queue of joins and leaves (taken when decided, before any
        await): the call after the one before it, whichever finishes its wait first."""
        before = self._turns.get(group)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns[group] = mine
        return before, mine

    def _end_turn(self, group: str, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._turns.get(group) is mine:
            del self._turns[group]

    async def join_again(self) -> None:
        """Join the other groups whose join failed (or that the layer may have lost), those
        this process still wants; a join that fails again is kept for the next sweep."""
        channel = self.channel
        if not self.unjoined_groups or self.layer is None or channel is None:
            return
        wanted = set(self.registry.other_groups())
        retry = [group for group in self.unjoined_groups if group in wanted]
        self.unjoined_groups.clear()
        if not retry:
            return
        results = await self._in_turns(retry, "group_add", channel)
        failed: list[str] = []
        for group, result in zip(retry, results, strict=True):
            if isinstance(result, Exception):
                failed.append(group)
            elif isinstance(result, BaseException):
                self.unjoined_groups.update(retry)  # not known to have landed
                raise result  # a cancellation
        if failed:
            logger.warning("Presence: channel layer group_add failed for %d groups.", len(failed))
            self.unjoined_groups.update(failed)

    async def leave_again(self) -> None:
        """Leave the groups whose leave failed, unless this channel wants them again."""
        if not self.undiscarded or self.layer is None:
            return
        wanted = self.registry.wanted_groups()
        retry = {
            group: channel
            for group, channel in self.undiscarded.items()
            if not (channel == self.channel and group in wanted)
        }
        self.undiscarded.clear()
        for group, channel in retry.items():
            (result,) = await self._in_turns([group], "group_discard", channel)
            if isinstance(result, Exception):
                self.undiscarded.setdefault(group, channel)
