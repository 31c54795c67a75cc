"""Maintenance: persisting last seen and removing stale entries (``manage.py presence_cleanup``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import partial

from django.utils import timezone

from presence import announce, copies, domain, outbox, resolution, signals
from presence.conf import get_settings
from presence.domain import UserId
from presence.models import LastSeen, PrivacySettings, UserStatus
from presence.operations import run
from presence.store import StoreUnavailable, get_store, merge_apart


@dataclass
class CleanupReport:
    buckets: int = 0
    stale: int = 0
    persisted: int = 0
    removed: int = 0
    #: custom statuses past their end cleared in the database (each announced to open sockets)
    expired_statuses: int = 0
    #: shards of Redis whose copy of the users' choices it had lost (restarted empty, flushed),
    #: seeded from the database (presence.copies)
    shards_seeded: int = 0
    #: users whose invisibility the online count had wrong (set in the database without a save
    #: signal, say a queryset update), put right
    invisible_fixed: int = 0
    #: room members whose stay had ended (crashed connections, the grace), removed with the
    #: keys of rooms left empty
    room_members: int = 0
    #: rooms some member was removed from, and rooms left empty (no key of theirs remains)
    rooms: int = 0
    rooms_emptied: int = 0
    dry_run: bool = False
    #: the Redis Cluster masters that were unavailable: their buckets and rooms were left for
    #: the next run (the other masters' were cleaned up)
    unavailable: list[str] = field(default_factory=list)


class CleanupIncomplete(StoreUnavailable):
    """Cleanup did what the other masters of a Redis Cluster hold, but these were unavailable
    (``report.unavailable``): their share is left for the next run. ``report``: what was done."""

    def __init__(self, report: CleanupReport) -> None:
        masters = ", ".join(report.unavailable)
        several = len(report.unavailable) > 1
        super().__init__(
            f"Redis Cluster master{'s' if several else ''} {masters} "
            f"{'were' if several else 'was'} unavailable: {'their' if several else 'its'} "
            "users and rooms were left for the next run; the other masters' were cleaned up"
        )
        self.report = report


def cleanup(dry_run: bool = False, batch: int | None = None) -> CleanupReport:
    """Persist last seen of users no longer online, then remove them from Redis.

    Works through the buckets ``batch`` at a time (one round trip each), so no Redis command
    touches more than one small bucket. Idempotent and safe to run concurrently: an entry is
    removed only if unchanged since it was persisted. Raises StoreUnavailable if Redis is down;
    on a Redis Cluster with a master unavailable, cleans up what the others hold, then raises
    :class:`CleanupIncomplete`, which names it. ``batch`` is a positive int, or None for
    ``CLEANUP_BATCH``; anything else raises ValueError (a batch below 1 would scan nothing and
    report success).
    """
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(
            f"cleanup(batch={batch!r}): batch is the number of Redis buckets read per round "
            "trip, a positive int, or None for PRESENCE['CLEANUP_BATCH']."
        )
    conf = get_settings()
    store = get_store()
    batch = conf.CLEANUP_BATCH if batch is None else batch
    now = resolution.now()
    before = now - conf.ONLINE_WINDOW
    timing = resolution.timing()
    report = CleanupReport(dry_run=dry_run)
    #: keys of what an unavailable cluster master left undone (to name it)
    skipped: list[str] = []
    for start in range(0, conf.BUCKETS, batch):
        buckets = list(range(start, min(start + batch, conf.BUCKETS)))
        # Each bucket apart: an unavailable cluster master's buckets (None) are left for later.
        scans = store.run(
            merge_apart([store.plans.scan_stale([bucket], before) for bucket in buckets])
        )
        skipped += [
            store.keys.seen_key(bucket)
            for bucket, found in zip(buckets, scans, strict=True)
            if found is None
        ]
        # The scan's bound catches every signed-off entry; the same rule as every read decides
        # which of those are still within OFFLINE_GRACE, so cleanup never cuts a grace short.
        entries = [
            entry
            for found in scans
            for entry in found or ()
            if domain.live_status(entry.state, now, timing) is domain.Status.OFFLINE
        ]
        report.buckets += sum(found is not None for found in scans)
        report.stale += len(entries)
        if dry_run or not entries:
            continue
        seen: dict[UserId, float] = {}
        for entry in entries:
            seen[entry.user_id] = max(seen.get(entry.user_id, 0.0), entry.seen_at)
        # The last seen of an earlier day that Redis keeps beside it (the approximate last
        # seen's base) first: the later one then keeps it as the row's prior (record_many).
        priors: dict[UserId, float] = store.run(store.plans.stale_priors(entries))
        LastSeen.objects.record_many(priors)
        report.persisted += LastSeen.objects.record_many(seen)
        removal = store.run(store.plans.remove_stale(entries, now))
        report.removed += removal.removed
        # Nobody swept these (a site without live processes): their transition is made here,
        # sent once its outbox entry is claimed (a reply lost on the way leaves it to the
        # next cleanup or sweep: presence.outbox).
        for user_id, invisible, at, made in removal.offline:
            claim = partial(outbox.run_live, store.plans.claim_entry(user_id, made))
            signals.send_if_claimed(claim, user_id, -1, at, invisible)
    unreachable: list[str] = []
    if not dry_run:
        store.run(store.plans.prune_schedules(now - conf.ONLINE_WINDOW))
        unreachable = _prune_rooms(report, now, skipped)
    if dry_run:
        report.expired_statuses = UserStatus.objects.filter(expires_at__lte=timezone.now()).count()
    else:
        report.expired_statuses = _clear_expired()
        report.shards_seeded = copies.seed() or 0
    try:
        report.invisible_fixed = _fix_invisible(dry_run)
    except StoreUnavailable:
        if not (skipped or unreachable):
            raise
        # (an unavailable master's share of the ledger unknown: compared at the next run)
    if not dry_run:
        # Transitions whose caller never claimed their signal (presence.outbox).
        run(outbox.claim_stale(now))
        signals.wait_sent()
    if skipped or unreachable:
        report.unavailable = sorted({*store.masters_of(skipped), *unreachable})
        raise CleanupIncomplete(report)
    return report


#: rooms claimed per round trip, and members removed per room per script
ROOMS_PER_ROUND = 200
MEMBERS_PER_PRUNE = 1000


def _glob(text: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def _schedule_lost_rooms(now: float) -> list[str]:
    """Rooms whose keys outlived their schedule entry (a process stopped between claiming a
    room and putting it back) are scheduled now: their summary keys (and outboxes: a room's
    last leave not yet claimed) found by SCAN on every master, each room added to its
    schedule only if it is not there. Returns the cluster masters that could not be scanned."""
    store = get_store()
    head, tail = f"{get_settings().KEY_PREFIX}:{{room:", len("}:n")
    pattern = f"{_glob(head)}*{_glob('}:')}[no]"
    keys, unavailable = store.scan_keys(pattern)
    rooms = list({str(key)[len(head) : -tail] for key in keys})
    for start in range(0, len(rooms), ROOMS_PER_ROUND):
        store.run(store.plans.schedule_missing_rooms(rooms[start : start + ROOMS_PER_ROUND], now))
    return unavailable


def _prune_rooms(report: CleanupReport, now: float, skipped: list[str]) -> list[str]:
    """Sweep every room due now, in rounds, until none is left: the members whose stay ended
    are removed (and announced to the room), and with a room's last member its last key. A
    room on an unavailable cluster master goes back on its schedule for later, its key added
    to ``skipped``. Returns the masters the search for lost rooms could not scan."""
    store = get_store()
    unreachable = _schedule_lost_rooms(now)
    swept: set[str] = set()
    emptied: set[str] = set()
    left: list[str] = []
    while rooms := store.run(store.plans.claim_rooms(now, ROOMS_PER_ROUND)):
        plans = [store.plans.prune_room(room, now, MEMBERS_PER_PRUNE) for room in rooms]
        # The leaves are sent as room_left (presence.outbox), with what was left unclaimed:
        # the prune claims those, so it waits for a busy Redis as a live sweep's does. Each
        # room apart: one on an unavailable cluster master reads None.
        results = outbox.run_live(merge_apart(plans))
        outbox.send_made(results)
        pruned = {room: p for room, p in zip(rooms, results, strict=True) if p is not None}
        left += [room for room in rooms if room not in pruned]
        due = {room: p.due for room, p in pruned.items() if p.due != math.inf}
        if due:
            store.run(
                store.plans.schedule_rooms(due)
            )  # a room with more to remove comes round again
        for room, each in pruned.items():
            if each.gone:
                swept.add(room)
                report.room_members += len(each.gone)
                announce.run_from_sync(announce.aannounce_room(room, each.gone), "a room's leaves")
            # (a room emptied stays due while its outbox holds the leaves: its due says nothing)
            if each.emptied:
                emptied.add(room)
    if left:
        # Claimed, not swept: back on their schedules once no more is claimed (the loop would
        # claim them again), else found by the next run's SCAN.
        store.run(store.plans.schedule_rooms(dict.fromkeys(left, now)))
        skipped.extend(store.keys.room_key(room, "n") for room in left)
    report.rooms, report.rooms_emptied = len(swept), len(emptied)
    return unreachable


#: expired custom statuses cleared (and announced) per query
CLEAR_BATCH = 500


def _clear_expired() -> int:
    """Clear the custom statuses past their end, and announce them (each a custom status change,
    as the sweep does): the sweep announced each at its end if Redis held its schedule entry,
    but one written while Redis was unavailable by a process that ended before writing it
    again, or lost with Redis's data, was not, and open sockets would show it for ever. A view
    told of it already is resolved again and sent nothing."""
    now = timezone.now()
    ids = list(UserStatus.objects.filter(expires_at__lte=now).values_list("user_id", flat=True))
    cleared = 0
    for start in range(0, len(ids), CLEAR_BATCH):
        batch = ids[start : start + CLEAR_BATCH]
        cleared += UserStatus.objects.filter(user_id__in=batch, expires_at__lte=now).update(
            text="", emoji="", activity="", expires_at=None
        )
        announce.announce(batch, change=domain.ACTIVITY_CHANGE)
    return cleared


def _fix_invisible(dry_run: bool) -> int:
    """The online count leaves out the users the store takes for invisible, a copy of
    ``PrivacySettings.invisible`` kept on each save: recomputed here from the database, so a
    drift (an update that sent no signal, a Redis restored from elsewhere) cannot persist."""
    store = get_store()
    # Redis first: a save writes the database, then Redis (presence.receivers), so a save
    # between the two reads is in the database's answer, and is written again here as it is;
    # read the other way round, it was in Redis only, and undone.
    known = store.run(store.plans.invisible_members())
    truth = set(PrivacySettings.objects.filter(invisible=True).values_list("user_id", flat=True))
    changes = sorted(truth ^ known, key=str)
    if changes and not dry_run:
        # Written as the database holds them now and checked after (presence.copies): a choice
        # committed since the reads above, whose own write came first, is not undone.
        run(copies.from_database(changes))
    return len(changes)
