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

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]

#: 00:30 UTC: a last seen of 23:59 yesterday is one day ago, though 31 minutes
NOW = datetime(2025, 3, 14, 0, 30, tzinfo=UTC)
TIMING = domain.Timing(online_window=300, offline_grace=5)

#: (last seen, expected bucket): the boundaries, written out from the contract
BOUNDARIES = [
    (NOW - timedelta(minutes=10), "recently"),  # today
    (datetime(2025, 3, 13, 23, 59, tzinfo=UTC), "recently"),  # yesterday: 1 day
    (datetime(2025, 3, 12, 0, 0, tzinfo=UTC), "recently"),  # 2 days
    (datetime(2025, 3, 11, 23, 59, 59, tzinfo=UTC), "within_week"),  # 3 days
    (datetime(2025, 3, 8, 12, 0, tzinfo=UTC), "within_week"),  # 6 days
    (datetime(2025, 3, 7, 23, 0, tzinfo=UTC), "within_month"),  # 7 days
    (datetime(2025, 2, 13, 0, 0, tzinfo=UTC), "within_month"),  # 29 days
    (datetime(2025, 2, 12, 23, 59, tzinfo=UTC), "long_ago"),  # 30 days
    (datetime(2020, 1, 1, tzinfo=UTC), "long_ago"),
    (NOW + timedelta(minutes=5), "recently"),  # a clock a little ahead: never negative
]


@pytest.mark.parametrize(("seen", "bucket"), BOUNDARIES, ids=[b[0].isoformat() for b in BOUNDARIES])
def test_buckets_count_whole_utc_days(seen: datetime, bucket: str) -> None:
    assert domain.approximate(seen.timestamp(), NOW.timestamp()) == bucket
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


def test_null_where_last_seen_shows_nothing_is_known_or_a_block_stands() -> None:
    now, live = NOW.timestamp(), domain.LiveState(last_active=NOW.timestamp() - 600)
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
