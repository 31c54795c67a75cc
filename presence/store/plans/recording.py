"""The plans that record presence: a request (touch), a sign-off, a connection's open,
heartbeat, close and expiry, and a description of a user's connections. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from presence import domain
from presence.conf import stamps_kept
from presence.store.keys import decode_score
from presence.store.plans.plan import RAISE, Plan, PlanArea, script_call
from presence.store.scripts import CONNECTION, DESCRIBE_CONNECTIONS, ERASE, SIGN_OFF, TOUCH
from presence.users import UserId, encode_id

ConnectionOp = Literal["open", "beat", "close", "expire"]


@dataclass(frozen=True)
class Transition:
    """A user's live state before and after a write."""

    user_id: UserId
    before: domain.LiveState
    after: domain.LiveState
    #: live connections left (connection writes only)
    connections: int | None = None
    #: a new connection past MAX_CONNECTIONS_PER_USER: nothing was recorded
    refused: bool = False
    #: connections this write found crashed (not heard from for CONNECTION_TTL) and dropped
    crashed: int = 0
    #: 1: this write made the user online, -1: offline (settled in the script, so exactly one
    #: write on the whole site says so for each transition: presence.signals), 0: neither
    made: int = field(default=0, compare=False)
    #: the user chose to be invisible (as the store knows it, see LedgerPlans.set_invisible)
    invisible: bool = field(default=False, compare=False)
    #: the store could not tell (its copy of the choices lost, not seeded again yet:
    #: lua/ledger.lua) and took the user for invisible; the choice is the database's to tell
    #: (and the shard is to be seeded: a write that made nothing says so too)
    guessed: bool = field(default=False, compare=False)
    #: when the transition happened: the write's time, or the moment the user turned offline
    at: float | None = field(default=None, compare=False)
    #: the transition's entry in the shard's outbox (lua/ledger.lua): whoever removes it sends
    #: the signal (presence.outbox)
    entry: str | None = field(default=None, compare=False)
    #: the write stamped its change itself (an open, lua/connection.lua): announcing it needs
    #: no stamp of its own (presence.announce)
    stamped: bool = field(default=False, compare=False)
    #: of the crashed connections, those whose last write changed what the user shows: their
    #: process may have died before announcing it (the others' last write was no news)
    unsettled: int = field(default=0, compare=False)
    #: this write also made the user offline, before its online (they were still in the ledger
    #: past their time: no sweep since): that offline's moment and outbox entry, sent first
    ended_at: float | None = field(default=None, compare=False)
    ended_entry: str | None = field(default=None, compare=False)

    @classmethod
    def from_reply(
        cls,
        user_id: UserId,
        reply: list[Any],
        ledger_at: int = 5,
        stamped: bool = False,
        ended_from: int | None = None,
    ) -> Transition:
        """A script's reply: old and new score, for connections (live connections, refused,
        crashed), then the ledger's verdict from ``ledger_at`` on (made, invisible, at, entry),
        and the offline made before it from ``ended_from`` on (its at and entry; by default
        right after the verdict)."""
        core = reply[:ledger_at]
        made: list[Any] = (
            reply[ledger_at : ledger_at + 4] if len(reply) >= ledger_at + 4 else [0, 0, None, None]
        )
        ended_from = ledger_at + 4 if ended_from is None else ended_from
        ended: list[Any] = (
            reply[ended_from : ended_from + 2] if len(reply) >= ended_from + 2 else [None, None]
        )
        return cls(
            user_id,
            decode_score(core[0]),
            decode_score(core[1]),
            int(core[2]) if len(core) > 2 else None,
            bool(int(core[3])) if len(core) > 3 else False,
            int(core[4]) if len(core) > 4 else 0,
            made=int(made[0]),
            invisible=bool(int(made[1])),
            guessed=int(made[1]) == 2,
            at=float(made[2]) if made[2] is not None else None,
            entry=_text(made[3]),
            stamped=stamped,
            unsettled=int(reply[10]) if len(reply) > 10 else 0,
            ended_at=float(ended[0]) if ended[0] not in (None, False) else None,
            ended_entry=_text(ended[1]),
        )


def _text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class RecordingPlans(PlanArea):
    """The plans that record requests and connections, over the key scheme."""

    def touch(self, user_id: UserId, device: domain.Device, now: float) -> Plan[Transition | None]:
        """Record a request. The user is due to turn offline ONLINE_WINDOW later at the latest
        (``LT``: an earlier due time, such as a connection's, is kept)."""
        seconds = int(now)
        keys = self.keys
        bucket = keys.bucket_of(user_id)
        return Plan(
            commands=[
                script_call(
                    TOUCH,
                    [
                        keys.seen_key(bucket),
                        keys.conns_key(bucket),
                        *keys.user_ledger_keys(user_id),
                        keys.user_outbox_key(user_id),
                        keys.prior_key(bucket),
                        keys.user_seeded_key(user_id),
                    ],
                    [
                        encode_id(user_id),
                        seconds,
                        domain.DEVICE_BITS[device],
                        seconds - self.conf.ONLINE_WINDOW,
                        self._ttl_start(seconds),
                        *self._timing(),
                    ],
                ),
                (
                    "ZADD",
                    keys.user_due_key(user_id),
                    "LT",
                    seconds + self.conf.ONLINE_WINDOW,
                    encode_id(user_id),
                ),
            ],
            parse=lambda replies: Transition.from_reply(user_id, replies[0], ledger_at=2),
            fallback=None,
        )

    def sign_off(
        self, user_id: UserId, device: domain.Device, now: float
    ) -> Plan[Transition | None]:
        seconds = int(now)
        keys = self.keys
        bucket = keys.bucket_of(user_id)
        return Plan(
            commands=[
                script_call(
                    SIGN_OFF,
                    [
                        keys.seen_key(bucket),
                        *keys.user_ledger_keys(user_id),
                        keys.user_outbox_key(user_id),
                        keys.prior_key(bucket),
                        keys.user_seeded_key(user_id),
                    ],
                    [
                        encode_id(user_id),
                        seconds,
                        domain.DEVICE_BITS[device],
                        self._ttl_start(seconds),
                        *self._timing(),
                        keys.closes_channel(),
                    ],
                ),
                (
                    "ZADD",
                    keys.user_due_key(user_id),
                    seconds + domain.SECOND + self.conf.OFFLINE_GRACE,
                    encode_id(user_id),
                ),
            ],
            parse=lambda replies: Transition.from_reply(user_id, replies[0], ledger_at=2),
            fallback=None,
        )

    def connection(
        self,
        user_id: UserId,
        op: ConnectionOp,
        now: float,
        connection_id: str = "-",
        device: domain.Device = domain.Device.WEB,
        idle: bool = False,
        retrying: bool = False,
    ) -> Plan[Transition | None]:
        """A connection's opening ("open"), heartbeat ("beat"), close, or ("expire") a check
        that drops the user's connections not heard from for CONNECTION_TTL.

        An open or a beat marks the connection unsettled when it changed what the user shows,
        or while (``retrying``) an announcement of the user's is being retried: if its process
        dies, dropping it is news (``Transition.unsettled``), as its change may never have been
        announced. Dropping a settled one is news only if it changes what the user shows.

        An open (or a beat of a connection no longer live) while the user has
        MAX_CONNECTIONS_PER_USER live connections is refused (``Transition.refused``) and
        records nothing. One round trip: the script, then the user's due time (a heartbeat's
        TTL, or the grace after the last connection closed); an open's due time is set by the
        script itself once it is accepted, so a refused one leaves no trace at all.
        """
        bucket = self.keys.bucket_of(user_id)
        seconds = int(now)
        keys = [
            self.keys.seen_key(bucket),
            self.keys.conns_key(bucket),
            self.keys.expiries_key(bucket),
            *self.keys.user_ledger_keys(user_id),
            self.keys.user_outbox_key(user_id),
            self.keys.prior_key(bucket),
            self.keys.user_seeded_key(user_id),
        ]
        due: list[Any] = ["", "", ""]  # ARGV[14..16]: an open's only
        if op == "open":
            # The due time of an accepted open is set by the script itself (KEYS[10], ARGV[14]),
            # and so is the stamp of the change it makes (KEYS[11..12], ARGV[15..16]; see
            # presence.stamps): a page view's socket pays one round trip for its opening.
            shard = self.keys.shard_of(bucket)
            keys += (
                self.keys.user_due_key(user_id),
                self.keys.changes_key(shard),
                self.keys.changes_epoch_key(shard),
            )
            due = [
                seconds + domain.SECOND + self.conf.CONNECTION_TTL,
                repr(now),
                repr(now - stamps_kept(self.conf)),
            ]
        commands: list[tuple[Any, ...]] = [
            script_call(
                CONNECTION,
                keys,
                [
                    encode_id(user_id),
                    op,
                    connection_id,
                    domain.DEVICE_BITS[device],
                    int(idle),
                    seconds,
                    self._ttl_start(seconds),
                    seconds - self.conf.ONLINE_WINDOW,
                    self.conf.MAX_CONNECTIONS_PER_USER,
                    *self._timing(),
                    self.keys.closes_channel(),
                    *due,
                    int(retrying),
                ],
            )
        ]
        if op == "beat":
            commands.append(self._connected_due(user_id, seconds))
        elif op == "close":
            commands.append(
                (
                    "ZADD",
                    self.keys.user_due_key(user_id),
                    seconds + domain.SECOND + self.conf.OFFLINE_GRACE,
                    encode_id(user_id),
                )
            )
        return Plan(
            commands=commands,
            parse=lambda replies: Transition.from_reply(
                user_id,
                replies[0],
                stamped=len(replies[0]) > 9 and replies[0][9] == 1,
                ended_from=11,
            ),
            fallback=None,
        )

    def erase(self, user_id: UserId, now: float) -> Plan[Transition | None]:
        """Remove everything live of a deleted user from their shard at once (lua/erase.lua):
        their last seen and prior, connections, schedules and place in the ledger. A user the
        ledger had online is made offline by it (``made`` -1, an outbox entry: the signal is
        sent once)."""
        bucket = self.keys.bucket_of(user_id)
        online, hidden, invisible = self.keys.user_ledger_keys(user_id)
        keys = [
            self.keys.seen_key(bucket),
            self.keys.prior_key(bucket),
            self.keys.conns_key(bucket),
            self.keys.expiries_key(bucket),
            self.keys.user_due_key(user_id),
            self.keys.user_expiring_key(user_id),
            self.keys.lease_key(self.keys.shard_of(bucket)),
            online,
            hidden,
            invisible,
            self.keys.user_outbox_key(user_id),
        ]
        return Plan(
            commands=[script_call(ERASE, keys, [encode_id(user_id), int(now)])],
            parse=lambda replies: Transition.from_reply(user_id, replies[0], ledger_at=2),
            fallback=None,
        )

    def _timing(self) -> tuple[float, float, float]:
        """The ledger's timing (lua/ledger.lua): offline grace, connection TTL, online window."""
        conf = self.conf
        return (conf.OFFLINE_GRACE, conf.CONNECTION_TTL, conf.ONLINE_WINDOW)

    def _ttl_start(self, seconds: int) -> int:
        """The scripts' "start of the connection TTL": a heartbeat recorded in a later second is
        live. The TTL counts from the end of the heartbeat's second, as in domain.offline_at."""
        return seconds - domain.SECOND - self.conf.CONNECTION_TTL

    def _connected_due(self, user_id: UserId, seconds: int) -> tuple[Any, ...]:
        return (
            "ZADD",
            self.keys.user_due_key(user_id),
            seconds + domain.SECOND + self.conf.CONNECTION_TTL,
            encode_id(user_id),
        )

    def connected(self, user_id: UserId, now: float) -> Plan[bool]:
        """The due time of a user whose connection was just opened (heartbeat + TTL); an open
        through :meth:`connection` sets it already, in its own round trip."""
        return Plan(
            commands=[self._connected_due(user_id, int(now))],
            parse=lambda replies: True,
            fallback=False,
        )

    def describe_connections(self, user_id: UserId) -> Plan[list[str]]:
        """The user's connections as "id:device_bit:idle:connected_at:heartbeat" and the devices
        of their page views while connected as "h<bit>:bit:1:at:at" (inspection and tests)."""
        bucket = self.keys.bucket_of(user_id)
        return Plan(
            commands=[
                script_call(
                    DESCRIBE_CONNECTIONS,
                    [self.keys.conns_key(bucket), self.keys.expiries_key(bucket)],
                    [encode_id(user_id), domain.SECOND + self.conf.CONNECTION_TTL],
                )
            ],
            parse=lambda replies: [str(entry) for entry in replies[0]],
            fallback=RAISE,
        )
