"""The live connections' side of the service: what the WebSocket consumer and the hub call.

Opening a connection, its heartbeats and close, the sweep that announces users who turned offline
by themselves, the hub's batched resolution for many viewers, and the consumer's snapshot read.
Like :mod:`presence.api` it builds store plans (:mod:`presence.store`), reads the relations
(:mod:`presence.relations`) and judges what it read with :mod:`presence.resolution`; each
operation is a generator of steps (:mod:`presence.operations`), run here on the event loop
(its callers, the consumer and the hub, are async).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from presence import announce, domain, outbox, relations, resolution, stamps
from presence.conf import STAMP_SLACK, get_settings
from presence.domain import Presence, UserId
from presence.models import LastSeen
from presence.operations import (
    Call,
    Operation,
    Redis,
    arun,
    both,
    call,
    redis,
    redis_then,
    run,
)
from presence.resolution import limits
from presence.store import ConnectionOp, Plan, Transition, get_store, merge
from presence.users import user_pk, viewer_pk

T = TypeVar("T")

__all__ = [
    "SweepReport",
    "achanged_since",
    "aconnect",
    "aconnect_checking",
    "adisconnect",
    "aerase_user",
    "aheartbeat",
    "apresence_for_viewers",
    "asnapshot",
    "asweep",
    "changes_plan",
    "limits",
    "user_deleted",
]


def _connection(
    user_id: UserId,
    op: ConnectionOp,
    connection_id: str,
    device: domain.Device = domain.Device.WEB,
    idle: bool = False,
    rider: tuple[Plan[Any], list[Any]] | None = None,
) -> Operation[Transition | None]:
    now = resolution.now()
    store = get_store()
    plan = store.plans.connection(
        user_id, op, now, connection_id, device, idle, announce.retrying(user_id)
    )
    if rider is not None:
        plan = _riding_along(plan, *rider)
    # The script settles the transition (presence.signals): its signal is sent even if this
    # handler is cancelled meanwhile (redis_then).
    transition = yield from redis_then(plan, outbox.send_made, live=True)
    if transition is not None and transition.refused:
        return transition  # nothing was recorded, nothing to announce
    # An accepted open's due time was set by its script (a refused one leaves no trace). The
    # last connection's end is persisted by the sweep that finds the user offline (_sweep):
    # on a site of pages the next page's socket opens within OFFLINE_GRACE, so a visit costs
    # the database one write, not one per page view.
    if resolution.is_news(transition, now):
        # An open's script stamped the change itself: announced without a stamp of its own.
        stamped = transition is not None and transition.stamped
        yield from call(
            announce.announce_change,
            [user_id],
            domain.LIVE_CHANGE,
            stamped,
            afunction=announce.aannounce_change,
        )
    return transition


#: a user still online whose crashed connection went: its process may have died before
#: announcing the user's last change through it, of any kind but a relation's
_UNSETTLED_CHANGE = domain.RULES_CHANGE.merged(
    domain.Change(domain.Kind.LIVE | domain.Kind.ACTIVITY)
)


def _riding_along(
    plan: Plan[Transition | None], rider: Plan[Any], answer: list[Any]
) -> Plan[Transition | None]:
    """``plan`` with ``rider``'s commands in the same round trip; the rider's answer is appended
    to ``answer`` (nothing when Redis is unavailable: the caller takes the rider's fallback)."""
    together: Plan[list[Any]] = merge([cast(Plan[Any], plan), rider])

    def parse(replies: list[Any]) -> Transition | None:
        transition, other = together.parse(replies)
        answer.append(other)
        return cast(Transition | None, transition)

    partial = None
    if together.partial is not None:
        read_partly = together.partial

        def partial(replies: list[Any]) -> Transition | None:
            transition, other = read_partly(replies)
            answer.append(other)
            return cast(Transition | None, transition)

    return Plan(commands=together.commands, parse=parse, fallback=plan.fallback, partial=partial)


async def aconnect(
    user: Any, connection_id: str, device: str = "web", idle: bool = False
) -> Transition | None:
    """A live connection opened: recorded like a heartbeat (``idle``: its client is idle
    already, as a hidden tab's reconnect is), unless the user already has
    MAX_CONNECTIONS_PER_USER live connections; then nothing is recorded and the transition says
    ``refused`` (the consumer closes the connection with 4429). Returns None when Redis is
    unavailable (the connection is not counted then)."""
    return await arun(
        _connection(user_pk(user), "open", connection_id, domain.Device(device), idle)
    )


async def aconnect_checking(
    user: Any, connection_id: str, device: str, check: Plan[T], idle: bool = False
) -> tuple[Transition | None, T]:
    """:func:`aconnect` with ``check`` (a socket's read of recent logouts, presence.sessions)
    in the same round trip: its answer beside the transition, its fallback when Redis is
    unavailable. A page view opens a socket: one round trip fewer for each."""
    answer: list[T] = []
    transition = await arun(
        _connection(
            user_pk(user), "open", connection_id, domain.Device(device), idle, (check, answer)
        )
    )
    return transition, answer[0] if answer else cast(T, check.fallback)


async def aheartbeat(
    user: Any, connection_id: str, device: str = "web", idle: bool = False
) -> Transition | None:
    """A live connection is alive: recorded with its device and idle state (a connection
    dropped meanwhile by crash detection comes back, within MAX_CONNECTIONS_PER_USER).

    Announced to viewers only when the user's status or devices changed. Returns None when
    Redis is unavailable (the outage is logged once).
    """
    return await arun(
        _connection(user_pk(user), "beat", connection_id, domain.Device(device), idle)
    )


async def adisconnect(user: Any, connection_id: str) -> Transition | None:
    """A live connection closed. The last one records last seen in Redis; friends see the user
    offline after OFFLINE_GRACE, when :func:`asweep` announces it and persists that last seen
    to the database (a page reload within the grace neither flaps nor writes)."""
    return await arun(_connection(user_pk(user), "close", connection_id))


@dataclass
class SweepReport:
    offline: list[UserId]
    rescheduled: int = 0
    expired_statuses: int = 0
    #: users still online whose state the sweep changed visibly or who had crashed connections
    changed: list[UserId] = field(default_factory=list)


async def asweep(limit: int | None = None) -> SweepReport:
    """Announce users who turned offline by themselves (crashed connections past
    CONNECTION_TTL, the end of OFFLINE_GRACE or ONLINE_WINDOW), users still online who lost a
    crashed connection, and custom statuses that expired.

    Each due user is claimed by one sweeper only; every live process runs this every
    SWEEP_INTERVAL (presence.hub), and running it more often or from several processes is safe.
    """
    return await arun(_sweep(limit))


def _sweep(limit: int | None) -> Operation[SweepReport]:
    conf = get_settings()
    store = get_store()
    now = resolution.now()
    timing = resolution.timing()
    # Claimed users are leased to this sweep until it gives them back (release, below): if this
    # process dies in between, the next sweep anywhere takes them once the lease lapses.
    lease_end = store.plans.lease_end(now)
    due, expiring = yield from redis(
        store.plans.claim_due(now, limit or conf.SWEEP_BATCH, lease_end), live=True
    )
    leased = list(due)
    # Transitions whose caller never claimed their signal (presence.outbox) are sent here.
    yield from outbox.claim_stale(now)
    # Users claimed by an earlier sweep here whose check failed are checked again first.
    due = list(dict.fromkeys([*store.unswept, *due]))
    store.unswept.difference_update(due)
    report = SweepReport(offline=[], expired_statuses=len(expiring))
    transitions: list[Transition | None] = []
    if due:
        # One round trip: each user's connections not heard from for CONNECTION_TTL go.
        transitions = yield from redis_then(
            merge([store.plans.connection(user_id, "expire", now) for user_id in due]),
            outbox.send_made,
            live=True,
        )
    later: dict[UserId, float] = {}
    # Users whose connections ended (closed, or crashed and dropped now) and who are offline:
    # their last activity becomes the persisted last seen, in one write for the whole sweep.
    ended: dict[UserId, float] = {}
    for user_id, transition in zip(due, transitions, strict=True):
        if transition is None:
            later[user_id] = now + conf.RETRY_INTERVAL  # Redis failed: try again soon
            continue
        state = transition.after
        if domain.live_status(state, now, timing) is domain.Status.OFFLINE:
            report.offline.append(user_id)
            if state.signed_off and state.last_active:
                ended[user_id] = state.last_active
        else:
            if resolution.is_news(transition, now):
                # Still online, but a crashed connection went (its devices, its activity) or
                # the process holding it died before announcing its last change.
                report.changed.append(user_id)
            offline_at = domain.offline_at(state, timing)
            if offline_at is not None:
                later[user_id] = offline_at
    report.rescheduled = len(later)
    if report.offline or report.changed or expiring:
        # Each with its kinds: a viewer who may not see a custom status is not told it ended.
        changes: dict[UserId, domain.Change] = dict.fromkeys(expiring, domain.ACTIVITY_CHANGE)
        for uid in report.offline:
            domain.add_change(changes, uid, domain.LIVE_CHANGE)
        for uid in report.changed:
            domain.add_change(changes, uid, _UNSETTLED_CHANGE)
        yield from call(
            announce.announce_change, list(changes), changes, afunction=announce.aannounce_change
        )
    if ended:
        # After the announcement: friends are told at once, not behind the database's queue.
        yield from call(LastSeen.objects.record_many, ended)
    # Given back only now: a sweeper killed before this point leaves its users leased, and the
    # sweep that takes them after the lease announces them (their transitions are made already,
    # so no signal is sent twice).
    if (later or leased) and not (
        yield from redis(store.plans.release(lease_end, leased, later), live=True)
    ):
        # Redis failed (and is left alone for RETRY_INTERVAL): the claim took these users out
        # of the schedule, so this process keeps them for its next sweep.
        store.unswept.update(later)
    return report


#: the live state of a user Redis does not hold: never online, or offline since long
_NEVER_LIVE = domain.LiveState()


def end_news_lag() -> float:
    """How long after an end (a turn offline, a custom status's end) fell due a view may still
    show what it ended (domain.END_NEWS_LAG), or longer where the settings make the sweep that
    announces it slower: two sweeps and a dead sweeper's lease."""
    conf = get_settings()
    slowest = 2 * (conf.SWEEP_INTERVAL + conf.LIVE_SOCKET_TIMEOUT) + STAMP_SLACK
    return max(domain.END_NEWS_LAG, slowest)


class ViewersPresence(dict[UserId, dict[UserId, Presence]]):
    """``{target: {viewer: presence}}``, and whether a change of a target can alter what a
    viewer sees (:meth:`sees`): asked for a viewer whose last view the fan-out does not hold."""

    def __init__(
        self, pairs: relations.PairFacts, states: Mapping[UserId, domain.LiveState], now: float
    ) -> None:
        super().__init__()
        self.pairs = pairs
        self.states = states
        self.now = now
        #: what of each target no view shows any longer (domain.ended_of), as asked
        self.ended: dict[UserId, domain.Ended] = {}

    def sees(self, target: UserId, viewer: UserId, change: domain.Change) -> bool:
        choices = self.pairs.choices.get(target)
        if choices is None:
            return True  # no such user (deleted meanwhile): shown as no one
        ended = self.ended.get(target)
        if ended is None:
            # The viewer's view is its page's, of a time not known here: an end is known to
            # it only once the sweep announced it. A user Redis does not hold is offline
            # since long (or was never online).
            live = self.states.get(target, _NEVER_LIVE)
            settled = self.now - end_news_lag()
            ended = domain.ended_of(live, choices, settled, resolution.timing())
            self.ended[target] = ended
        return change.seen_by(viewer, choices, self.pairs.relation(viewer, target), ended)


async def apresence_for_viewers(
    watchers: Mapping[UserId, Collection[UserId]],
) -> ViewersPresence | None:
    """Presence of each target as each of its viewers may see it, for the live fan-out:
    ``{target: {viewer: presence}}`` from ``{target: viewer ids}``. Three queries and one Redis
    round trip whatever the number of viewers. Targets of no user are left out; None when
    Redis is unavailable (nothing is guessed)."""
    return await arun(_presence_for_viewers(watchers))


def _presence_for_viewers(
    watchers: Mapping[UserId, Collection[UserId]],
) -> Operation[ViewersPresence | None]:
    store = get_store()
    # Judged as of the start of the read (see resolution.is_news).
    now = resolution.now()
    viewers = {viewer for viewer_ids in watchers.values() for viewer in viewer_ids}
    read = Redis(store.plans.read(watchers), live=True)
    load = Call(relations.load_pairs, (viewers, list(watchers)), relations.aload_pairs)
    if store.known_down():
        # It answers at once, and the database need not be read for nothing.
        states = yield read
        pairs = None if states is None else (yield load)
    else:
        # Redis and the database at once: neither needs the other's answer.
        states, pairs = yield from both(read, load)
    if states is None or pairs is None:
        return None
    timing = resolution.timing()
    unknown = domain.LiveState()
    resolved = ViewersPresence(pairs, states, now)
    for target, choices in pairs.choices.items():
        live = states.get(target, unknown)
        # Most viewers share a relation (contact, stranger, ...): resolved once per relation,
        # and its viewers share one Presence (the hub renders each distinct one once).
        by_relation: dict[domain.Relation, Presence] = {}
        seen = resolved[target] = {}
        for viewer in watchers[target]:
            relation = pairs.relation(viewer, target)
            presence = by_relation.get(relation)
            if presence is None:
                presence = by_relation[relation] = domain.resolve(
                    live, choices, relation, now, timing
                )
            seen[viewer] = presence
    return resolved


async def asnapshot(targets: Iterable[UserId], viewer: Any) -> tuple[dict[UserId, Presence], bool]:
    """Presence of ``targets`` as ``viewer`` may see it (a subscribe's snapshot), and whether it
    is a guess: True when Redis could not be read, so it shows what the database alone knows
    (offline, persisted last seen) and the caller should resolve these users again later."""
    presences, guessed, _ = await arun(_snapshot(targets, viewer))
    return presences, guessed


async def asnapshot_changed(
    changed: Mapping[UserId, domain.Kind], viewer: Any, since: float | None = None
) -> tuple[dict[UserId, Presence], bool, set[UserId]]:
    """:func:`asnapshot` of users changed since a stamp (``changed``: each with the kinds of
    its changes, as :func:`achanged_since` gives them; ``since``: the stamp's time), and those
    of them whose changes ``viewer`` may not see (domain.Change.seen_by: no kinds, or kinds
    that cannot alter what ``viewer`` sees of them). Those are left out of the snapshot: a
    blocked or non-permitted viewer is answered the same whether they changed or not."""
    unseen = {uid for uid, kinds in changed.items() if not kinds}
    ids = [uid for uid, kinds in changed.items() if kinds]
    if not ids:
        return {}, False, unseen
    presences, guessed, hidden = await arun(_snapshot(ids, viewer, changed, since))
    return presences, guessed, unseen | hidden


def _snapshot(
    targets: Iterable[UserId],
    viewer: Any,
    changed: Mapping[UserId, domain.Kind] | None = None,
    since: float | None = None,
) -> Operation[tuple[dict[UserId, Presence], bool, set[UserId]]]:
    ids = resolution.unique(targets)
    store = get_store()
    # Judged as of the start of the read (see resolution.is_news).
    now = resolution.now()
    # Redis and the database at once (ids of no user cost Redis nothing: they are not there).
    # Every user's state, as read() gives it (since 0: none left out), in one script call
    # instead of two ZMSCOREs per bucket: 100 commands for a page of 50 people, whose packing
    # and parsing cost more than the read.
    facts, live = yield from both(
        Call(relations.load, (viewer, ids), relations.aload),
        Redis(store.plans.read_recent(ids, 0), live=True),
    )
    unseen: set[UserId] = set()
    if changed is not None:
        viewer_id = viewer_pk(viewer)
        between = frozenset(() if viewer_id is None else (viewer_id,))
        # An end since the stamp is among the kinds (a schedule due since counts as one,
        # achanged_since); one before it, the view of the stamp's time shows already.
        settled = now - end_news_lag() if since is None else since - STAMP_SLACK
        timing = resolution.timing()
        for uid, (relation, choices) in list(facts.items()):
            # Redis unread: nothing is known to be over; a user it does not hold is offline
            # since long (read_recent since 0 leaves no one out).
            state = None if live is None else live.get(uid, _NEVER_LIVE)
            ended = domain.ended_of(state, choices, settled, timing)
            change = domain.Change(changed[uid], between)
            if not change.seen_by(viewer_id, choices, relation, ended):
                unseen.add(uid)
                del facts[uid]
    return resolution.resolve_all(facts, live, now), live is None, unseen


async def achanged_since(
    targets: Collection[UserId], viewer_id: UserId, since: float
) -> dict[UserId, domain.Kind] | None:
    """The ``targets`` who may look different to ``viewer_id`` now than at ``since`` (a
    stamp's time, presence.stamps), each with the kinds of their changes since: a change
    announced since (status, privacy, relations, online or offline), or a turn offline or a
    custom status's end that fell due since and may not be announced yet. Whether the viewer
    may see such a change is the caller's to ask (domain.Change.seen_by): no kinds, a change
    of relation with someone else. None where Redis cannot prove that the others did not
    change (it is unavailable, or was flushed since): the caller sends the full snapshot. One
    round trip.

    A change of the viewer's own settings changes what they see of others only with
    RECIPROCAL_LAST_SEEN: then such a change of the viewer since ``since`` counts for every
    target."""
    return await arun(_changed_since(targets, viewer_id, since))


def _changed_since(
    targets: Collection[UserId], viewer_id: UserId, since: float
) -> Operation[dict[UserId, domain.Kind] | None]:
    plan = changes_plan(targets, viewer_id, since)
    if not plan.commands:
        return {}
    return (yield from redis(plan, live=True))


#: the kinds of a viewer's own change that alter what they see of others (RECIPROCAL_LAST_SEEN:
#: their own last-seen level and invisibility; their relations are stamped on the others too)
_OWN_SHAPING = domain.Kind.RULES | domain.Kind.INVISIBLE | domain.Kind.UNKNOWN | domain.LEVELS


def changes_plan(
    targets: Collection[UserId], viewer_id: UserId, since: float
) -> Plan[dict[UserId, domain.Kind] | None]:
    """:func:`achanged_since`'s read as a plan, its answer the same: a socket that subscribes
    in its opening request reads it in the round trip of its opening write (aconnect_checking).
    No commands when there is nothing to ask."""
    reciprocal = get_settings().RECIPROCAL_LAST_SEEN is True
    asked = [*targets, viewer_id] if reciprocal else list(targets)
    read = stamps.changed_since_plan(asked, viewer_id, since, resolution.now() + STAMP_SLACK)
    if not read.commands:
        return read

    def parse(replies: list[Any]) -> dict[UserId, domain.Kind] | None:
        changed = read.parse(replies)
        if changed is None:
            return None
        if reciprocal and changed.get(viewer_id, domain.Kind(0)) & _OWN_SHAPING:
            return None
        return {uid: kinds for uid, kinds in changed.items() if uid in targets}

    return Plan(commands=read.commands, parse=parse, fallback=None)


# --- a deleted user -----------------------------------------------------------------------------


def _erase_user(user_id: UserId) -> Operation[Transition | None]:
    store = get_store()
    # The script settles the transition like any write: user_offline is sent once, if the
    # user was online (redis_then: even if the caller is cancelled meanwhile).
    return (yield from redis_then(store.plans.erase(user_id, resolution.now()), outbox.send_made))


async def aerase_user(user_id: UserId) -> Transition | None:
    """Remove everything Redis holds live of a deleted user (one script on their shard): no
    longer online, counted, due or connected. None when Redis is unavailable (logged)."""
    return await arun(_erase_user(user_id))


def user_deleted(user_id: UserId) -> None:
    """A user was deleted (after its commit; presence.receivers): their live state is erased
    at once (``online_count`` falls, ``user_offline`` is sent if they were online), those
    watching them are shown them offline, and their sockets close with 4401 in every process,
    leaving their rooms at once. Never raises for a Redis or channel-layer outage (logged)."""
    run(_erase_user(user_id))
    announce.announce([user_id])
    announce.run_from_sync(announce.aannounce_user_deleted(user_id), "a deleted user")
