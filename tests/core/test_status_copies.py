"""Redis's copy of the users' choices follows the database (presence.copies): two changes of
one user that cross between the database and Redis, a Redis that lost the copy (flushed) met by
a write, and ``presence_cleanup`` on such a Redis. The online count leaves invisible users out,
and user_online says what the database says.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, transaction
from django.utils import timezone

from presence import api, copies, outbox, signals
from presence.domain import Device
from presence.models import PrivacySettings, UserStatus
from presence.operations import run
from presence.store import PresenceStore, get_store
from tests.conftest import _flush_presence_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.uuid_site, pytest.mark.cluster]


@pytest.fixture
def onlines() -> Iterator[list[tuple[Any, bool]]]:
    """(user id, invisible) of each user_online sent in the test."""
    got: list[tuple[Any, bool]] = []

    def record(sender: Any, user_id: Any, invisible: bool, **kwargs: Any) -> None:
        got.append((user_id, invisible))

    signals.user_online.connect(record)
    yield got
    signals.wait_sent()
    signals.user_online.disconnect(record)


def told(got: list[tuple[Any, bool]], user: Any) -> list[bool]:
    signals.wait_sent()
    return [invisible for user_id, invisible in got if user_id == user.pk]


def within(seconds: float, check: Callable[[], bool]) -> bool:
    """Whether ``check()`` holds within ``seconds`` (work of a thread of presence's own)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_two_changes_that_cross_leave_the_databases_last_word(
    make_user: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    onlines: list[tuple[Any, bool]],
) -> None:
    # Device A makes the user visible: its rows are committed, and its write to Redis is held
    # back; meanwhile device B (another thread, or process) makes them invisible, rows and
    # Redis. A's write then reaches Redis last.
    user = make_user()
    held, reached = threading.Event(), threading.Event()
    first_writer: list[threading.Thread] = []
    run = PresenceStore.run

    def held_back(store: PresenceStore, plan: Any) -> Any:
        if threading.current_thread() in first_writer and not held.is_set():
            reached.set()
            held.wait(10)
        return run(store, plan)

    monkeypatch.setattr(PresenceStore, "run", held_back)
    device_a = threading.Thread(target=api.set_status, args=(user, "auto"))
    first_writer.append(device_a)
    device_a.start()
    assert reached.wait(10)
    api.set_status(user, "invisible")
    held.set()
    device_a.join(10)
    assert PrivacySettings.objects.get(user=user).invisible is True
    api.touch(user)
    assert api.online_count() == 0
    assert told(onlines, user) == [True]


def test_a_write_on_a_redis_that_lost_the_choices_tells_the_databases(
    make_user: Callable[..., Any], redis_url: str, onlines: list[tuple[Any, bool]]
) -> None:
    shown, hidden = make_user(), make_user()
    api.set_status(hidden, "invisible")
    _flush_presence_state(redis_url)  # Redis restarted empty
    api.touch(hidden)
    assert api.online_count() == 0
    api.touch(shown)
    # The shard is seeded from the database by then or soon after: the visible user counts,
    # the invisible one never did.
    assert within(10, lambda: api.online_count() == 1)
    assert told(onlines, hidden) == [True]
    assert told(onlines, shown) == [False]


def test_cleanup_seeds_a_redis_that_lost_the_choices(
    make_user: Callable[..., Any], redis_url: str, onlines: list[tuple[Any, bool]]
) -> None:
    user = make_user()
    api.set_status(user, "invisible", text="Away", expires_at=timezone.now() + timedelta(hours=1))
    _flush_presence_state(redis_url)
    report = api.cleanup()
    assert report.shards_seeded >= 1
    api.touch(user)
    assert api.online_count() == 0
    assert told(onlines, user) == [True]
    assert api.cleanup().shards_seeded == 0


# --- a database that fails right after the commit -----------------------------------------------


@pytest.fixture
def database_fails(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Makes the next read of the users' choices fail, as a connection the database dropped
    right after the commit (the copy's reads are the first after it)."""
    read, failures = copies.read, []

    def flaky(user_ids: Any) -> Any:
        if failures:
            raise failures.pop()
        return read(user_ids)

    monkeypatch.setattr(copies, "read", flaky)
    return lambda: failures.append(OperationalError("server closed the connection unexpectedly"))


def test_a_database_failing_after_the_commit_fails_no_save_and_loses_no_choice(
    make_user: Callable[..., Any],
    database_fails: Callable[[], None],
    onlines: list[tuple[Any, bool]],
) -> None:
    user = make_user()
    hooks: list[str] = []
    database_fails()
    # A site's form saves the choice, and has a hook of its own run after the commit.
    with transaction.atomic():
        PrivacySettings.objects.update_or_create(user=user, defaults={"invisible": True})
        transaction.on_commit(lambda: hooks.append("the site's"))
    assert hooks == ["the site's"]
    api.touch(user)
    assert api.online_count() == 0
    assert told(onlines, user) == [True]


def test_a_status_row_saved_while_the_database_fails_after_the_commit(
    make_user: Callable[..., Any], database_fails: Callable[[], None]
) -> None:
    user = make_user()
    PrivacySettings.objects.create(user=user, invisible=True)
    store = get_store()
    store.run(store.plans.set_invisible(user.pk, False))  # (a copy gone wrong meanwhile)
    hooks: list[str] = []
    database_fails()
    with transaction.atomic():
        UserStatus.objects.create(user=user, text="Lunch")  # as the admin would
        transaction.on_commit(lambda: hooks.append("the site's"))
    assert hooks == ["the site's"]
    # Its copy, from the database, once it can be read (by this process, soon after).
    assert within(10, lambda: store.run(store.plans.invisible_members()) == {user.pk})


# --- a change rolled back ------------------------------------------------------------------------


def test_a_status_chosen_in_a_transaction_rolled_back_leaves_redis_as_it_was(
    make_user: Callable[..., Any], onlines: list[tuple[Any, bool]]
) -> None:
    user = make_user()
    api.set_status(user, "invisible")
    with contextlib.suppress(RuntimeError), transaction.atomic():
        api.set_status(user, "auto")
        raise RuntimeError("the caller's request failed after")
    assert PrivacySettings.objects.get(user=user).invisible is True
    api.touch(user)
    assert api.online_count() == 0
    assert told(onlines, user) == [True]


def test_a_status_chosen_in_a_transaction_reaches_redis_when_it_commits(
    make_user: Callable[..., Any], onlines: list[tuple[Any, bool]]
) -> None:
    user = make_user()
    api.touch(user)
    with transaction.atomic():
        api.set_status(user, "invisible")
        assert api.online_count() == 1  # (not committed yet: nothing chosen)
    assert api.online_count() == 0
    assert told(onlines, user) == [False]


# --- a transition Redis guessed, its reply never read ---------------------------------------------


def test_a_guessed_transition_claimed_by_the_sweep_tells_the_databases_choice(
    make_user: Callable[..., Any], redis_url: str, onlines: list[tuple[Any, bool]]
) -> None:
    shown = make_user()
    _flush_presence_state(redis_url)  # Redis restarted empty
    store = get_store()
    # A page's write that Redis ran after the page gave up on it (its reply never read): its
    # transition is left in the outbox, for the sweep.
    store.run(store.plans.touch(shown.pk, Device.WEB, time.time()))
    assert api.online_count() == 0  # (taken for invisible until the seed)
    assert run(outbox.claim_stale(time.time() + outbox.deadline() + 1)) == 1
    assert told(onlines, shown) == [False]
    # And the shard is seeded from the database: the user is counted.
    assert within(10, lambda: api.online_count() == 1)


def test_a_write_that_makes_no_transition_on_a_redis_that_lost_the_choices_seeds_it(
    make_user: Callable[..., Any], redis_url: str
) -> None:
    shown = make_user()
    _flush_presence_state(redis_url)
    store = get_store()
    now = time.time()
    store.run(store.plans.touch(shown.pk, Device.WEB, now))  # (its reply never read)
    api.touch(shown)  # online already: no transition
    assert within(10, lambda: api.online_count() == 1)
