"""Redis's copy of the choices its scripts act on: whether a user chose to be invisible (the
online ledger's ``invisible`` set: who ``online_count`` leaves out, and the ``invisible`` of
``user_online`` / ``user_offline``) and when their custom status expires (the ``expiring``
schedule: the sweep announces the clearing to open sockets).

The database holds the choices (``PrivacySettings.invisible``, ``UserStatus``); the copy follows
it whatever happens in between, since what it gets wrong is what privacy hides:

- written after commit (the caller's own, for a change made inside its transaction), then
  checked against the database (:func:`write`): a change committed meanwhile by someone else
  whose own write reached Redis first (two devices of one user, an HTTP request and a socket
  of two processes) is written again, so the last write is of the database's last word; a
  database that cannot be read then (its connection lost right after the commit) leaves the
  check to :func:`later`, and nothing raises out of the ``on_commit`` hook
  (:func:`after_commit`);
- a write Redis did not take (unavailable) is tried again by this process every
  ``RETRY_INTERVAL`` until it does, from the database as it then stands (:func:`later`);
- a Redis that lost the copy (restarted without persistence, flushed) or may hold an old one
  (restarted from a snapshot, a replica promoted: its shards were seeded by another run of the
  server) is seeded from the database again (:func:`seed`, lua/seed_ledger.lua): until then the
  ledger's scripts take a user they cannot tell for invisible (lua/ledger.lua), the signal of
  such a transition reads the choice from the database (:func:`chose_invisible`), whoever
  sends it, and the shard is seeded at once by a thread of the process whose write met it
  (:func:`seed_soon`);
- ``presence_cleanup`` seeds too, and compares the whole invisible set with the database (a
  change made without signals, a process killed before its retry).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import DatabaseError, connections

from presence.conf import get_settings
from presence.models import PrivacySettings, UserStatus
from presence.operations import Operation, call, redis, run
from presence.store import StoreUnavailable, get_store
from presence.store.plans.ledger import Choices
from presence.users import UserId

logger = logging.getLogger("presence")

#: writes of one copy checked against the database before it is left to :func:`later` (each
#: further one needs another change committed meanwhile)
CHECKS = 3


def read(user_ids: Iterable[UserId]) -> dict[UserId, Choices]:
    """The database's choices of these users, as Redis copies them (two queries)."""
    ids: list[Any] = list(user_ids)
    invisible = set(
        PrivacySettings.objects.filter(user_id__in=ids, invisible=True).values_list(
            "user_id", flat=True
        )
    )
    ends: dict[UserId, float] = {}
    rows = UserStatus.objects.filter(user_id__in=ids, expires_at__isnull=False).values_list(
        "user_id", "expires_at", "text", "emoji", "activity"
    )
    for user_id, expires_at, *custom in rows:
        if expires_at is not None and any(custom):  # (an end without a custom status: none)
            ends[user_id] = expires_at.timestamp()
    return {user_id: (user_id in invisible, ends.get(user_id)) for user_id in ids}


def write(copies: Mapping[UserId, Choices]) -> Operation[None]:
    """Write these users' copies (the database's choices, committed), then check them against
    the database: a copy it no longer holds (a change committed meanwhile, whose own write may
    have come first) is written again. Never raises for Redis or the database: the users whose
    copy Redis did not take, or the database could not check, are left to :func:`later`."""
    store = get_store()
    pending = dict(copies)
    for _ in range(CHECKS):
        failed: set[UserId] = yield from redis(store.plans.copy_choices(pending))
        if failed:
            later(failed)
        written = [user_id for user_id in pending if user_id not in failed]
        if not written:
            return
        now = yield from _read(written)
        if now is None:
            return
        pending = {user_id: now[user_id] for user_id in written if now[user_id] != pending[user_id]}
        if not pending:
            return
    later(pending)


def write_invisible(user_id: UserId, invisible: bool) -> Operation[None]:
    """Write the user's choice to be invisible as the caller saved it (committed: a saved
    PrivacySettings), then check it against the database as :func:`write` does. Written
    first, before any read: a database that cannot be read now (its connection lost right
    after the commit) still leaves Redis with the choice, the check left to :func:`later`.
    Never raises for Redis or the database."""
    store = get_store()
    failed: set[UserId] = yield from redis(store.plans.copy_invisible({user_id: invisible}))
    if failed:
        later(failed)
        return
    now = yield from _read([user_id])
    if now is not None and now[user_id][0] != invisible:
        yield from write(now)  # (changed meanwhile: its last word)


def from_database(user_ids: Iterable[UserId]) -> Operation[None]:
    """:func:`write` of these users' choices as the database holds them now (left to
    :func:`later` when it cannot be read). Never raises for Redis or the database."""
    copies = yield from _read(list(user_ids))
    if copies is not None:
        yield from write(copies)


def _read(user_ids: list[UserId]) -> Operation[dict[UserId, Choices] | None]:
    """:func:`read`, or None when the database failed: the users are left to :func:`later`
    (a copy is written after a commit: the caller's save stands, and must not fail for it)."""
    try:
        now: dict[UserId, Choices] = yield from call(read, user_ids)
    except DatabaseError:
        logger.warning(
            "Presence: could not read the choices of %d users to copy them to Redis; retrying.",
            len(user_ids),
            exc_info=True,
        )
        later(user_ids)
        return None
    return now


def after_commit(operation: Operation[None], user_ids: Iterable[UserId]) -> None:
    """Run a copy's ``operation`` from sync code that must not raise: an ``on_commit`` hook,
    whose exception would fail the caller's save though it was committed, and make Django drop
    the transaction's later hooks (the site's own). Whatever it raises is logged, and the
    users (``user_ids``) left to :func:`later`."""
    ids = list(user_ids)
    try:
        run(operation)
    except Exception:
        logger.exception("Presence: copying the choices of %d users to Redis failed", len(ids))
        later(ids)


# --- written again later, seeded again --------------------------------------------------------

#: what this process's retrying thread has to do: the users whose copy Redis did not take,
#: and whether a shard is to be seeded (a write met one not seeded)
_pending: set[UserId] = set()
_seed_wanted = False
_lock = threading.Lock()
_wake = threading.Event()
_thread: threading.Thread | None = None


def later(user_ids: Iterable[UserId]) -> None:
    """Write these users' copies again, from the database, once Redis takes them: tried every
    ``RETRY_INTERVAL`` by a thread of this process, for as long as it takes (a user's choice
    to be invisible must reach the ledger). A process that ends first leaves them to
    ``presence_cleanup``."""
    with _lock:
        _pending.update(user_ids)
        _start()


def seed_soon() -> None:
    """:func:`seed` at once on the retrying thread (a write met a shard not seeded: presence.
    outbox), and again every ``RETRY_INTERVAL`` until it succeeds; once however many writes
    ask meanwhile."""
    global _seed_wanted
    with _lock:
        if _seed_wanted:
            return
        _seed_wanted = True
        _wake.set()
        _start()


def _start() -> None:
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_retry, name="presence-copies", daemon=True)
        _thread.start()


def pending() -> set[UserId]:
    """The users whose copy is waiting to be written again (tests, inspection)."""
    with _lock:
        return set(_pending)


#: how often the retrying thread looks whether Redis may be tried again (no I/O): as soon as
#: it may, the thread's write is among the first (Redis back, the copy right within this)
POLL = 0.05


def _retry() -> None:
    global _thread, _seed_wanted
    pause = POLL
    while True:
        _wake.wait(pause)
        _wake.clear()
        pause = POLL
        with _lock:
            if not (_pending or _seed_wanted):
                _thread = None
                return
            if get_store().known_down():
                continue  # (Redis left alone until RETRY_INTERVAL passed: the store's policy)
            user_ids, seeding = list(_pending), _seed_wanted
            _pending.clear()
            _seed_wanted = False
        try:
            if seeding and seed() is None:
                with _lock:
                    _seed_wanted = True
            if user_ids:
                run(from_database(user_ids))  # (a database it cannot read: left to later)
        except Exception:
            logger.exception(
                "Presence: copying the choices of %d users to Redis failed; retrying.",
                len(user_ids),
            )
            with _lock:
                _pending.update(user_ids)
        finally:
            connections.close_all()  # (this thread's own)
        with _lock:
            if _pending or _seed_wanted:
                pause = get_settings().RETRY_INTERVAL  # (failed again: not before the policy)


def forget() -> None:
    """Drop what is waiting to be done (a test's end)."""
    global _seed_wanted
    with _lock:
        _pending.clear()
        _seed_wanted = False
    _wake.set()


def _after_fork() -> None:
    # (a forked child has none of its parent's threads; what they had to do is the parent's)
    global _lock, _wake, _thread, _seeding, _seed_wanted
    _lock, _wake, _thread = threading.Lock(), threading.Event(), None
    _seeding, _seed_wanted = threading.Lock(), False
    _pending.clear()


_seeding = threading.Lock()


def seed() -> int | None:
    """Seed the shards whose copy Redis lost (lua/seed_ledger.lua), from the database: its
    users who chose to be invisible and its custom statuses that expire, read in two queries
    (each shard's kept). One process at a time here; several processes may seed at once (the
    first to finish a shard wins, the others' parts are left out). How many shards it seeded;
    None when it failed (logged: Redis or the database unavailable)."""
    store = get_store()
    with _seeding:
        try:
            shards = store.run(store.plans.unseeded_shards())
            if not shards:
                return 0
            wanted = set(shards)
            shard_of = store.keys.shard_of_user
            invisible: dict[int, list[UserId]] = defaultdict(list)
            ids = PrivacySettings.objects.filter(invisible=True).values_list("user_id", flat=True)
            for user_id in ids.iterator(chunk_size=2000):
                if (shard := shard_of(user_id)) in wanted:
                    invisible[shard].append(user_id)
            expiring: dict[int, list[tuple[UserId, float]]] = defaultdict(list)
            rows = UserStatus.objects.filter(expires_at__isnull=False).values_list(
                "user_id", "expires_at", "text", "emoji", "activity"
            )
            for user_id, expires_at, *custom in rows.iterator(chunk_size=2000):
                if expires_at is None or not any(custom):
                    continue
                if (shard := shard_of(user_id)) in wanted:
                    expiring[shard].append((user_id, expires_at.timestamp()))
            seeded = store.run(store.plans.seed(shards, invisible, expiring))
        except StoreUnavailable:
            return None  # (the outage is logged by the store)
        except Exception:
            logger.exception("Presence: seeding Redis's copy of the users' choices failed")
            return None
    if seeded:
        logger.info(
            "Presence: seeded %d shard(s) of Redis with the users' choices (Redis had lost "
            "them: restarted or flushed).",
            seeded,
        )
    return int(seeded)


def chose_invisible(user_id: UserId) -> bool:
    """Whether the user chose to be invisible, as the database says (a transition the store
    guessed: its signal tells this instead). Invisible when the database cannot tell."""
    try:
        user: Any = user_id
        return PrivacySettings.objects.filter(user_id=user, invisible=True).exists()
    except Exception:
        logger.exception("Presence: reading user %s's choice to be invisible failed", user_id)
        return True


os.register_at_fork(after_in_child=_after_fork)
