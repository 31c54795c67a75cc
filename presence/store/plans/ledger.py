"""The plans of the online ledger (lua/ledger.lua): the number of users online, and the users'
choice to be invisible as the ledger's scripts see it. No I/O.

The writes' own scripts (touch, sign-off, connections, cleanup's removal) keep the ledger; these
plans read it and keep its invisible set in step with ``PrivacySettings.invisible``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from presence.store.keys import expiry_score
from presence.store.plans.outbox import OutboxEntry, claim, parse_entry
from presence.store.plans.plan import RAISE, Plan, PlanArea, script_call
from presence.store.scripts import IS_SEEDED, OUTBOX_CLAIM, SEED_LEDGER, SET_INVISIBLE
from presence.users import UserId, encode_id, id_decoder

#: a user's choices as Redis copies them (presence.copies): whether they chose to be invisible,
#: and when their custom status expires (None: never, or no custom status)
Choices = tuple[bool, float | None]

#: users (or expiries) per script call of a seed: a long script would hold Redis up
SEED_PART = 1000


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
        seeded, touched, _ = self.keys.seed_keys(self.keys.shard_of_user(user_id))
        return Plan(
            commands=[
                script_call(
                    SET_INVISIBLE,
                    [*self.keys.user_ledger_keys(user_id), seeded, touched],
                    [encode_id(user_id), int(invisible)],
                )
            ],
            parse=lambda replies: bool(int(replies[0])),
            fallback=False,
        )

    def copy_choices(self, copies: Mapping[UserId, Choices]) -> Plan[set[UserId]]:
        """Write Redis's copy of these users' choices (presence.copies): their place in the
        invisible set (:meth:`set_invisible`) and their custom status's expiry (the expiring
        schedule). One round trip (one per master on a cluster). Answers the users whose copy
        could not be written: every one when Redis is unavailable."""
        users = list(copies)
        commands: list[tuple[Any, ...]] = []
        for user_id, (invisible, ends) in copies.items():
            commands += self.set_invisible(user_id, invisible).commands
            # (as SchedulePlans.schedule_expiry)
            key, member = self.keys.user_expiring_key(user_id), encode_id(user_id)
            commands.append(
                ("ZREM", key, member) if ends is None else ("ZADD", key, expiry_score(ends), member)
            )

        def partial(replies: list[Any]) -> set[UserId]:
            return {
                user_id
                for i, user_id in enumerate(users)
                if any(isinstance(reply, Exception) for reply in replies[2 * i : 2 * i + 2])
            }

        return Plan(
            commands=commands,
            parse=lambda replies: set(),
            fallback=set(users),
            partial=partial,
        )

    def copy_invisible(self, choices: Mapping[UserId, bool]) -> Plan[set[UserId]]:
        """Write Redis's copy of these users' choice to be invisible alone (a saved
        PrivacySettings: presence.copies), as :meth:`copy_choices` writes it. Answers the users
        whose copy could not be written."""
        users = list(choices)
        commands: list[tuple[Any, ...]] = []
        for user_id, invisible in choices.items():
            commands += self.set_invisible(user_id, invisible).commands

        def partial(replies: list[Any]) -> set[UserId]:
            return {
                user_id
                for user_id, reply in zip(users, replies, strict=True)
                if isinstance(reply, Exception)
            }

        return Plan(
            commands=commands,
            parse=lambda replies: set(),
            fallback=set(users),
            partial=partial,
        )

    def unseeded_shards(self) -> Plan[list[int]]:
        """The shards whose copy of the choices was not seeded from the database by the Redis
        server's current run (lua/seed_ledger.lua): lost (a flush, a restart without
        persistence), or maybe old (a restart that loaded a snapshot, a replica promoted). One
        script call per shard. On a cluster with a master unavailable, the others' (its shards
        are looked at next time)."""
        shards = list(self.keys.shards())

        def parse(replies: list[Any]) -> list[int]:
            return [
                shard
                for shard, reply in zip(shards, replies, strict=True)
                if not isinstance(reply, Exception) and not int(reply)
            ]

        return Plan(
            commands=[
                script_call(IS_SEEDED, [self.keys.seeded_key(shard)], []) for shard in shards
            ],
            parse=parse,
            fallback=RAISE,
            partial=parse,
        )

    def seed(
        self,
        shards: Iterable[int],
        invisible: Mapping[int, Sequence[UserId]],
        expiring: Mapping[int, Sequence[tuple[UserId, float]]],
    ) -> Plan[int]:
        """Seed these shards with the database's choices, read before (lua/seed_ledger.lua): each
        shard's users who chose to be invisible (``invisible[shard]``) and its custom statuses'
        expiries (``expiring[shard]``, their end), :data:`SEED_PART` per script call, the last
        call marking the shard seeded. One round trip (one per master on a cluster). How many
        shards this seeded (one seeded meanwhile by another process is left as it is)."""
        commands: list[tuple[Any, ...]] = []
        lasts: list[int] = []
        for shard in shards:
            keys = [
                *self.keys.ledger_keys(shard),
                self.keys.shard_expiring_key(shard),
                *self.keys.seed_keys(shard),
            ]
            members = [encode_id(user_id) for user_id in invisible.get(shard, ())]
            pairs = [
                (expiry_score(at), encode_id(user_id)) for user_id, at in expiring.get(shard, ())
            ]
            while True:
                part, members = members[:SEED_PART], members[SEED_PART:]
                room = SEED_PART - len(part)
                due, pairs = pairs[:room], pairs[room:]
                last = not members and not pairs
                args = [int(last), len(part), *part, *(value for pair in due for value in pair)]
                commands.append(script_call(SEED_LEDGER, keys, args))
                if last:
                    lasts.append(len(commands) - 1)
                    break

        def parse(replies: list[Any]) -> int:
            return sum(
                1 for i in lasts if not isinstance(replies[i], Exception) and int(replies[i])
            )

        return Plan(commands=commands, parse=parse, fallback=RAISE, partial=parse)

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
