"""The plans of the online ledger (lua/ledger.lua): the number of users online, and the users'
choice to be invisible as the ledger's scripts see it. No I/O.

The writes' own scripts (touch, sign-off, connections, cleanup's removal) keep the ledger; these
plans read it and keep its invisible set in step with ``PrivacySettings.invisible``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from presence.store.plans.outbox import OutboxEntry, claim, parse_entry
from presence.store.plans.plan import RAISE, Plan, PlanArea, script_call
from presence.store.scripts import OUTBOX_CLAIM, SET_INVISIBLE
from presence.users import UserId, encode_id, id_decoder


class LedgerPlans(PlanArea):
    """The plans that read the online ledger and set who is invisible, over the key scheme."""

    def count_online(self, now: float) -> Plan[int | None]:
        """Users online now whom others may see online (invisible users left out): one ZCOUNT
        per shard (one on one Redis; one round trip per master on a cluster), whatever the
        number online. None when Redis is unavailable; on a cluster with a master down, the
        other masters' users."""

        def parse(replies: list[Any]) -> int | None:
            counts = [int(reply) for reply in replies if not isinstance(reply, Exception)]
            return sum(counts) if counts else None

        return Plan(
            commands=[
                # "(" : a user turns offline at that very time (domain.live_status)
                ("ZCOUNT", self.keys.ledger_keys(shard)[0], f"({now!r}", "+inf")
                for shard in self.keys.shards()
            ],
            parse=parse,
            fallback=None,
            partial=parse,
        )

    def claim_entry(self, user_id: UserId, entry: str) -> Plan[bool]:
        """Claims a transition's entry in the user's shard's outbox (:func:`claim`)."""
        return claim(self.keys.user_outbox_key(user_id), entry)

    def claim_stale_entries(self, before: float, limit: int) -> Plan[list[OutboxEntry]]:
        """Claims the transitions made at ``before`` or earlier that nobody claimed (their
        caller never got the reply, or died first): one script per shard, at most ``limit``
        each. A shard that fails keeps its entries for the next sweep."""

        def parse(replies: list[Any]) -> list[OutboxEntry]:
            decode = id_decoder()
            return [
                parse_entry(entry, decode)
                for reply in replies
                if not isinstance(reply, Exception)
                for entry in reply
            ]

        return Plan(
            commands=[
                script_call(OUTBOX_CLAIM, [self.keys.outbox_key(shard)], [int(before), limit])
                for shard in self.keys.shards()
            ],
            parse=parse,
            fallback=[],
            partial=parse,
        )

    def set_invisible(self, user_id: UserId, invisible: bool) -> Plan[bool]:
        """The user chose to be invisible (or not): counted or not from now on, online or not."""
        return Plan(
            commands=[
                script_call(
                    SET_INVISIBLE,
                    self.keys.user_ledger_keys(user_id),
                    [encode_id(user_id), int(invisible)],
                )
            ],
            parse=lambda replies: bool(int(replies[0])),
            fallback=False,
        )

    def invisible_members(self) -> Plan[set[UserId]]:
        """Every user the ledger takes for invisible (presence_cleanup compares them with the
        database). One SMEMBERS per shard."""

        def parse(replies: list[Any]) -> set[UserId]:
            decode = id_decoder()
            return {decode(member) for reply in replies for member in reply}

        return Plan(
            commands=[
                ("SMEMBERS", self.keys.ledger_keys(shard)[2]) for shard in self.keys.shards()
            ],
            parse=parse,
            fallback=RAISE,
        )

    def set_invisible_many(self, changes: Iterable[tuple[UserId, bool]]) -> Plan[int]:
        """:meth:`set_invisible` of many users in one round trip; how many changed."""
        commands: list[tuple[Any, ...]] = []
        for user_id, invisible in changes:
            commands += self.set_invisible(user_id, invisible).commands
        return Plan(
            commands=commands,
            parse=lambda replies: sum(int(reply) for reply in replies),
            fallback=RAISE,
        )

    def outbox_size(self) -> Plan[int]:
        """Transitions in the outboxes that nobody claimed yet (tests, inspection)."""
        return Plan(
            commands=[("ZCARD", self.keys.outbox_key(shard)) for shard in self.keys.shards()],
            parse=lambda replies: sum(int(reply) for reply in replies),
            fallback=RAISE,
        )

    def ledger_sizes(self) -> Plan[dict[str, int]]:
        """How many users each part of the ledger holds, past their time included (tests,
        inspection): ``{"online": ..., "hidden": ..., "invisible": ...}``."""
        names = ("online", "hidden", "invisible")
        commands: list[tuple[Any, ...]] = []
        for shard in self.keys.shards():
            online, hidden, invisible = self.keys.ledger_keys(shard)
            commands += [("ZCARD", online), ("ZCARD", hidden), ("SCARD", invisible)]

        def parse(replies: list[Any]) -> dict[str, int]:
            sizes: dict[str, int] = defaultdict(int)
            for i, reply in enumerate(replies):
                sizes[names[i % 3]] += int(reply)
            return dict(sizes)

        return Plan(commands=commands, parse=parse, fallback=RAISE)
