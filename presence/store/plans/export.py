"""The plans that read everything Redis holds about one user, for a data request
(``api.export_user_data``): their live state, connections, schedules and place in the online
ledger, and the rooms they are in. No I/O. Read, never written; they fail loudly (RAISE): an
export that silently left Redis out would be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from presence import domain
from presence.store.keys import decode_score
from presence.store.plans.plan import RAISE, Plan, PlanArea, script_call
from presence.store.scripts import DESCRIBE_CONNECTIONS
from presence.users import UserId, encode_id


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class UserRecord:
    """What Redis holds about one user (times in epoch seconds)."""

    #: the user's score in their bucket, decoded (None: nothing live is held)
    live: domain.LiveState | None
    #: the last seen of an earlier UTC day that today's activity replaced
    prior: float | None
    #: "connection id:device bit:idle:connected at:last heartbeat", and the devices of page
    #: views while connected as "h<bit>:bit:1:at:at" (lua/describe_connections.lua)
    connections: tuple[str, ...]
    #: when the user turns offline unless something happens (the due schedule)
    due: float | None
    #: the online ledger: when the user turns offline there, counted (online) or not (hidden)
    online_until: float | None
    hidden_until: float | None
    #: the ledger's copy of the user's choice to be invisible
    invisible: bool
    #: when the user's custom status expires (the expiring schedule)
    status_expires: float | None


class ExportPlans(PlanArea):
    """The plans of a data request, over the key scheme."""

    def describe_user(self, user_id: UserId) -> Plan[UserRecord]:
        """Everything of ``user_id``'s own keys and schedule entries, in one round trip (one
        master on a cluster: the user's bucket and schedules share its shard's slot)."""
        member = encode_id(user_id)
        bucket = self.keys.bucket_of(user_id)
        online, hidden, invisible = self.keys.user_ledger_keys(user_id)

        def parse(replies: list[Any]) -> UserRecord:
            seen, prior, connections, due, on, off, flagged, expires = replies
            return UserRecord(
                live=None if seen is None else decode_score(seen),
                prior=_seconds(prior),
                connections=tuple(_text(entry) for entry in connections),
                due=_seconds(due),
                online_until=_seconds(on),
                hidden_until=_seconds(off),
                invisible=bool(int(flagged)),
                status_expires=_seconds(expires),
            )

        return Plan(
            commands=[
                ("ZSCORE", self.keys.seen_key(bucket), member),
                ("ZSCORE", self.keys.prior_key(bucket), member),
                script_call(
                    DESCRIBE_CONNECTIONS,
                    [self.keys.conns_key(bucket), self.keys.expiries_key(bucket)],
                    [member, domain.SECOND + self.conf.CONNECTION_TTL],
                ),
                ("ZSCORE", self.keys.user_due_key(user_id), member),
                ("ZSCORE", online, member),
                ("ZSCORE", hidden, member),
                ("SISMEMBER", invisible, member),
                ("ZSCORE", self.keys.user_expiring_key(user_id), member),
            ],
            parse=parse,
            fallback=RAISE,
        )

    def scheduled_rooms(self) -> Plan[list[str]]:
        """Every room with members recorded (each is in its shard's room schedule from its
        first join until its last member is swept): one ZRANGE per shard. A room a sweep has
        claimed at this very moment is out of its schedule for the sweep's length."""
        return Plan(
            commands=[("ZRANGE", key, 0, -1) for key in self.keys.room_schedules()],
            parse=lambda replies: sorted({_text(room) for reply in replies for room in reply}),
            fallback=RAISE,
        )
