"""The approximate last seen: whole UTC days between the day of the last seen and today (0-2
recently, 3-6 within a week, 7-29 within a month, 30+ a long time ago), null where last seen
shows, where nothing is known and across a block; on every path; off with
APPROXIMATE_LAST_SEEN=False. Row 8 of the rule in docs/privacy.md."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.utils import translation

from presence import api, domain
from presence.models import Block, LastSeen
from presence.rendering import script_labels
from presence.store import get_store

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]

#: 00:30 UTC: a last seen of 23:59 yesterday is one day ago, though 31 minutes
NOW = datetime(2025, 3, 14, 0, 30, tzinfo=UTC)
TIMING = domain.Timing(online_window=300, offline_grace=5)

#: (last seen, expected bucket): the boundaries, written out from the contract
BOUNDARIES: list[tuple[datetime, str | None]] = [
    (NOW - timedelta(minutes=10), None),  # today: counts from the next midnight
    (datetime(2025, 3, 13, 23, 59, tzinfo=UTC), "recently"),  # yesterday: 1 day
    (datetime(2025, 3, 12, 0, 0, tzinfo=UTC), "recently"),  # 2 days
    (datetime(2025, 3, 11, 23, 59, 59, tzinfo=UTC), "within_week"),  # 3 days
    (datetime(2025, 3, 8, 12, 0, tzinfo=UTC), "within_week"),  # 6 days
    (datetime(2025, 3, 7, 23, 0, tzinfo=UTC), "within_month"),  # 7 days
    (datetime(2025, 2, 13, 0, 0, tzinfo=UTC), "within_month"),  # 29 days
    (datetime(2025, 2, 12, 23, 59, tzinfo=UTC), "long_ago"),  # 30 days
    (datetime(2020, 1, 1, tzinfo=UTC), "long_ago"),
    (NOW + timedelta(minutes=5), None),  # a clock a little ahead: today too
]


@pytest.mark.parametrize(("seen", "bucket"), BOUNDARIES, ids=[b[0].isoformat() for b in BOUNDARIES])
def test_buckets_count_whole_utc_days(seen: datetime, bucket: str | None) -> None:
    assert domain.approximate_before_today(seen.timestamp(), None, NOW.timestamp()) == bucket
    live = domain.LiveState(last_active=seen.timestamp())
    stranger = domain.resolve(live, domain.Choices(), domain.STRANGER, NOW.timestamp(), TIMING)
    assert (stranger.last_seen, stranger.last_seen_approx) == (None, bucket)


def test_it_changes_only_at_utc_midnight() -> None:
    seen = datetime(2025, 3, 11, 8, 0, tzinfo=UTC).timestamp()
    day = datetime(2025, 3, 13, 0, 0, tzinfo=UTC).timestamp()
    # All of 13 March (2 days) is "recently", to the last second; 14 March is "within_week".
    assert {domain.approximate(seen, day + s) for s in range(0, 86_400, 997)} == {"recently"}
    assert domain.approximate(seen, day + 86_399.9) == "recently"
    assert domain.approximate(seen, day + 86_400) == "within_week"


#: midnight UTC of NOW's day
MIDNIGHT = datetime(2025, 3, 14, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("last_seen", "prior", "now", "bucket"),
    [
        # The last seen is of a day before today: it counts, whatever the prior.
        (MIDNIGHT - 1, None, MIDNIGHT, "recently"),
        (MIDNIGHT - 3 * 86_400, MIDNIGHT - 40 * 86_400, MIDNIGHT + 86_399, "within_week"),
        # Of today: the prior counts, to the last second of the day ...
        (MIDNIGHT, MIDNIGHT - 5 * 86_400, MIDNIGHT + 86_399.9, "within_week"),
        (MIDNIGHT + 60, MIDNIGHT - 1, MIDNIGHT + 120, "recently"),
        (MIDNIGHT + 60, MIDNIGHT - 40 * 86_400, MIDNIGHT + 120, "long_ago"),
        # ... and at midnight the day's activity does (one day ago).
        (MIDNIGHT + 60, MIDNIGHT - 5 * 86_400, MIDNIGHT + 86_400, "recently"),
        # Nothing before today known (a first visit): null until midnight.
        (MIDNIGHT, None, MIDNIGHT + 86_399, None),
        (MIDNIGHT + 86_399, None, MIDNIGHT + 86_400, "recently"),
        (MIDNIGHT + 60, MIDNIGHT + 30, MIDNIGHT + 120, None),  # a "prior" of today: none
        (None, None, MIDNIGHT, None),
    ],
)
def test_activity_of_today_counts_from_the_next_midnight(
    last_seen: float | None, prior: float | None, now: float, bucket: str | None
) -> None:
    assert domain.approximate_before_today(last_seen, prior, now) == bucket


def test_the_latest_known_before_today_counts_in_the_resolver() -> None:
    now = NOW.timestamp()
    today, five_days = now - 60, now - 5 * 86_400

    def seen(live: domain.LiveState, persisted: float | None = None) -> str | None:
        choices = domain.Choices(persisted_last_seen=persisted)
        return domain.resolve(live, choices, domain.STRANGER, now, TIMING).last_seen_approx

    assert seen(domain.LiveState(last_active=today)) is None
    assert seen(domain.LiveState(last_active=today, prior=five_days)) == "within_week"
    # The database's last seen (presence_cleanup) of today is no earlier value either ...
    assert seen(domain.LiveState(), persisted=today) is None
    # ... but an older one counts beside Redis's today (a Redis flushed, or not yet prior).
    assert seen(domain.LiveState(last_active=today), persisted=five_days) == "within_week"
    assert seen(domain.LiveState(last_active=five_days), persisted=today) == "within_week"


def test_a_sign_off_of_today_changes_nothing_before_midnight() -> None:
    """Issue 34: back today after five days away, the user signs off at 11:17 and the sign-off
    writes today's time to the database (the sweep, a logout, presence_cleanup). A stranger is
    shown "within_week" all day whatever holds the times, and "recently" from midnight."""
    midnight = MIDNIGHT + 86_400  # the day after NOW's: today is 14 March
    five_days, morning = MIDNIGHT - 5 * 86_400 + 3600, MIDNIGHT + 9 * 3600
    sign_off = MIDNIGHT + 11 * 3600 + 17 * 60

    def shown(live: domain.LiveState, choices: domain.Choices, now: float) -> str | None:
        return domain.resolve(live, choices, domain.STRANGER, now, TIMING).last_seen_approx

    # Where the times may be, during the day: Redis's seen (and its prior, kept when the
    # morning's write replaced the earlier day's), the database's row (and its prior, kept when
    # the sign-off's write replaced the earlier day's), either of them gone (a flush, cleanup).
    redis_back = domain.LiveState(last_active=morning, prior=five_days)
    redis_off = domain.LiveState(last_active=sign_off, signed_off=True, prior=five_days)
    forgotten = domain.LiveState()  # flushed, or removed by presence_cleanup
    redis_no_prior = domain.LiveState(last_active=sign_off, signed_off=True)  # was not in Redis
    db_before = domain.Choices(persisted_last_seen=five_days)
    db_after = domain.Choices(persisted_last_seen=sign_off, persisted_prior=five_days)
    states = [
        (redis_back, db_before),
        (redis_off, db_before),
        (redis_off, db_after),  # failed before: min(database, Redis) was today's sign-off
        (redis_no_prior, db_before),
        (redis_no_prior, db_after),  # failed before
        (forgotten, db_after),  # failed before: nothing of an earlier day was kept
    ]
    for now in (morning, sign_off, sign_off + 60, midnight - 0.1):
        assert [shown(live, choices, now) for live, choices in states] == ["within_week"] * 6
    # From midnight the day's activity counts (one day ago), whatever holds it.
    assert [shown(live, choices, midnight) for live, choices in states] == ["recently"] * 6


@pytest.mark.parametrize(
    ("stored", "new", "kept"),
    [
        ((None, None), MIDNIGHT + 60, (MIDNIGHT + 60, None)),  # a first write
        # The same day: the later time, the prior as it was.
        ((MIDNIGHT + 60, MIDNIGHT - 9), MIDNIGHT + 70, (MIDNIGHT + 70, MIDNIGHT - 9)),
        ((MIDNIGHT + 60, None), MIDNIGHT + 50, (MIDNIGHT + 60, None)),
        # A later day: the time it replaces becomes the prior (the older prior is earlier).
        ((MIDNIGHT - 5, MIDNIGHT - 9 * 86_400), MIDNIGHT + 3, (MIDNIGHT + 3, MIDNIGHT - 5)),
        # A late write of an earlier day: never backwards, but the prior may rise.
        ((MIDNIGHT + 60, MIDNIGHT - 9 * 86_400), MIDNIGHT - 7, (MIDNIGHT + 60, MIDNIGHT - 7)),
        ((MIDNIGHT + 60, MIDNIGHT - 3), MIDNIGHT - 7, (MIDNIGHT + 60, MIDNIGHT - 3)),
        ((MIDNIGHT + 60, None), MIDNIGHT - 7, (MIDNIGHT + 60, MIDNIGHT - 7)),
    ],
)
def test_a_write_keeps_the_last_seen_it_replaces_on_a_later_day(
    stored: tuple[float | None, float | None],
    new: float,
    kept: tuple[float, float | None],
) -> None:
    assert domain.carry_last_seen(*stored, new) == kept


@pytest.mark.parametrize("portable", [False, True], ids=["sql", "portable"])
def test_the_database_keeps_the_last_seen_of_an_earlier_day(
    make_user: Callable[..., Any], portable: bool
) -> None:
    """LastSeen.record_many's SQL (and its ORM path for other databases) does what
    domain.carry_last_seen says, row by row."""
    users = [make_user() for _ in range(4)]
    stored = [
        (MIDNIGHT - 5 * 86_400 + 3600, None),
        (MIDNIGHT + 60, MIDNIGHT - 9 * 86_400),
        (MIDNIGHT + 60, MIDNIGHT - 9 * 86_400),
        (MIDNIGHT - 1, MIDNIGHT - 9 * 86_400),
    ]
    new = [MIDNIGHT + 11 * 3600, MIDNIGHT + 3600, MIDNIGHT - 7, MIDNIGHT + 86_400 * 2]

    def at(seconds: float | None) -> datetime | None:
        return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)

    for user, (seen, prior) in zip(users, stored, strict=True):
        LastSeen.objects.create(user=user, seen_at=at(seen), prior_seen_at=at(prior))
    times = {u.pk: t for u, t in zip(users, new, strict=True)}
    if portable:
        rows = [(pk, datetime.fromtimestamp(t, tz=UTC)) for pk, t in times.items()]
        assert LastSeen.objects._record_portably(rows, "default") == 4
    else:
        assert LastSeen.objects.record_many(times) == 4
    rows = {row.user_id: row for row in LastSeen.objects.filter(user__in=users)}
    found = [(rows[u.pk].seen_at, rows[u.pk].prior_seen_at) for u in users]
    expected = [
        tuple(map(at, domain.carry_last_seen(*was, time)))
        for was, time in zip(stored, new, strict=True)
    ]
    assert found == expected
    assert expected[0] == (at(new[0]), at(stored[0][0]))  # the sign-off's case


@pytest.mark.parametrize("persisted", [None, "yesterday", "today"])
def test_presence_cleanup_persists_the_last_seen_of_an_earlier_day_redis_kept(
    make_user: Callable[..., Any], persisted: str | None
) -> None:
    """Seen late one day and just after midnight: Redis keeps the first as the second's prior;
    cleanup writes both, so the approximate last seen holds after Redis forgets them (a flush,
    the entry removed) whatever the row held before."""
    user = make_user()
    late, early = MIDNIGHT - 120, MIDNIGHT + 60
    if persisted is not None:
        seen = late - 3600 if persisted == "yesterday" else early - 30
        LastSeen.objects.create(user=user, seen_at=datetime.fromtimestamp(seen, tz=UTC))
    for moment in (late, early):
        with time_machine.travel(moment, tick=False):
            api.touch(user)
    with time_machine.travel(early + 3600, tick=False):
        assert api.cleanup().removed == 1
    row = LastSeen.objects.get(user=user)
    assert (row.seen_at.timestamp(), row.prior_seen_at.timestamp()) == (early, late)


def test_null_where_last_seen_shows_nothing_is_known_or_a_block_stands() -> None:
    # Last seen yesterday: "recently" for a stranger, unless one of these holds.
    now, live = NOW.timestamp(), domain.LiveState(last_active=NOW.timestamp() - 86_400)
    everyone = domain.Choices(
        online_visibility=domain.Visibility.EVERYONE,
        last_seen_visibility=domain.Visibility.EVERYONE,
    )
    shown = domain.resolve(live, everyone, domain.STRANGER, now, TIMING)
    assert shown.last_seen is not None and shown.last_seen_approx is None
    unknown = domain.resolve(domain.LiveState(), domain.Choices(), domain.STRANGER, now, TIMING)
    assert unknown.last_seen_approx is None
    blocked = domain.Relation(is_contact=True, blocked=True)
    assert domain.resolve(live, everyone, blocked, now, TIMING) == domain.HIDDEN
    own = domain.resolve(live, domain.Choices(), domain.SELF, now, TIMING)
    assert own.last_seen is not None and own.last_seen_approx is None
    off = domain.Timing(online_window=300, offline_grace=5, approximate_last_seen=False)
    assert domain.resolve(live, domain.Choices(), domain.STRANGER, now, off) == domain.HIDDEN
    # The persisted last seen counts too (it survives a Redis flush).
    persisted = domain.Choices(persisted_last_seen=now - 10 * 86_400)
    seen = domain.resolve(domain.LiveState(), persisted, domain.STRANGER, now, TIMING)
    assert seen.last_seen_approx == "within_month"


def test_on_the_read_paths_and_off_by_setting(settings: Any, make_user: Callable[..., Any]) -> None:
    viewer, target, blocker = make_user(), make_user(), make_user()
    LastSeen.objects.create(user=target, seen_at=NOW - timedelta(days=4))
    LastSeen.objects.create(user=blocker, seen_at=NOW - timedelta(days=4))
    Block.objects.create(blocker=blocker, blocked=viewer)
    client = Client()
    client.force_login(viewer)
    with time_machine.travel(NOW, tick=False):
        api.touch(target)  # back today: "within_week" until midnight (the days before count)
        assert api.get_presence(target, viewer).last_seen_approx == "within_week"
        assert api.get_presence(blocker, viewer).last_seen_approx is None
        assert api.get_presence(target, None).last_seen_approx == "within_week"  # anonymous
        answer = client.get("/presence/api/presence", {"users": f"{target.pk},{blocker.pk}"})
        presences = answer.json()["presences"]
        assert presences[str(target.pk)]["last_seen_approx"] == "within_week"
        assert presences[str(blocker.pk)]["last_seen_approx"] is None
        settings.PRESENCE = {**getattr(settings, "PRESENCE", {}), "APPROXIMATE_LAST_SEEN": False}
        assert api.get_presence(target, viewer).last_seen_approx is None
        answer = client.get("/presence/api/presence", {"users": str(target.pk)})
        assert answer.json()["presences"][str(target.pk)]["last_seen_approx"] is None


def test_back_after_five_days_reads_within_week_until_midnight(
    make_user: Callable[..., Any],
) -> None:
    """Through Redis: the write that brings a user back keeps the last seen of the earlier day
    (the prior), and every read path counts from it until midnight."""
    store = get_store()
    user, never_seen = make_user().pk, make_user().pk
    five_days_ago = MIDNIGHT - 5 * 86_400 + 3600
    store.run(store.plans.touch(user, domain.Device.WEB, five_days_ago))
    store.run(store.plans.touch(user, domain.Device.WEB, NOW.timestamp()))
    store.run(store.plans.touch(never_seen, domain.Device.WEB, NOW.timestamp()))
    for read in (store.plans.read, lambda ids: store.plans.read_recent(ids, NOW.timestamp() - 300)):
        states = store.run(read([user, never_seen]))
        assert states is not None
        assert states[user].last_active == NOW.timestamp()
        assert states[user].prior == five_days_ago
        assert states[never_seen].prior is None
        bucket = {
            uid: domain.approximate_before_today(state.last_active, state.prior, now)
            for now in (NOW.timestamp(), MIDNIGHT + 86_399)
            for uid, state in states.items()
        }
        assert bucket == {user: "within_week", never_seen: None}
    # The next day's first activity keeps today's as the prior: "recently" from midnight on.
    store.run(store.plans.touch(user, domain.Device.WEB, MIDNIGHT + 86_400 + 5))
    states = store.run(store.plans.read([user]))
    assert states is not None and states[user].prior == NOW.timestamp()


@pytest.mark.parametrize(
    ("language", "words"),
    [
        (
            "en",
            [
                "last seen recently",
                "last seen within a week",
                "last seen within a month",
                "last seen a long time ago",
            ],
        ),
        (
            "ja",
            [
                "最近オンライン",
                "1週間以内にオンライン",
                "1か月以内にオンライン",
                "長期間オフライン",
            ],
        ),
        ("zh-hans", ["最近上线", "一周内上线", "一个月内上线", "很久以前上线"]),
        (
            "vi",
            [
                "truy cập gần đây",
                "truy cập trong tuần qua",
                "truy cập trong tháng qua",
                "truy cập từ lâu",
            ],
        ),
    ],
)
def test_humanized_without_a_number_or_a_time(language: str, words: list[str]) -> None:
    now = NOW
    with translation.override(language):
        said = [
            domain.humanize(domain.Presence(last_seen_approx=bucket), now)
            for bucket in domain.LastSeenApprox
        ]
        labels = script_labels()
    assert said == words
    assert [labels[bucket.value] for bucket in domain.LastSeenApprox] == words
