"""The activity feed (presence.feed): page cost of the four timelines as the table grows.

Setup (not measured): USERS users with a mix of privacy settings, a viewer following FOLLOWING
of them (half follow back, some mark the viewer a close friend, a few blocks either way) and
member of 20 groups of 20 to 2,000 members; activities by random authors at a steady rate (3 %
mention the viewer, 20 % someone else), written with bulk inserts (COPY on PostgreSQL).

Growth is measured side by side, like every ratio of these benchmarks: two databases of the same
kind hold the same users and graph, one with SMALL activities and one with LARGE; the small
one's activities are the large one's newest, so every page must come out the same in both (it
is checked) and only the table size differs. Each call is timed alternately on the two.

Measured, on SQLite and (with ``--postgres URL``) PostgreSQL, each the median of RUNS calls of
the public API: the first page (50 activities) and the 20th page (from the cursor of the 19th)
of the following, group, mentions and one-person timelines, their growth from SMALL to LARGE
activities (goal: within 2x; a page must not cost more as the table grows; judged on process CPU
time for SQLite, which runs in this process, so other processes cannot inflate it, and on wall
time for PostgreSQL), and a page loaded right after a follow against any page load (goal: the
same cost; the newly followed author's activity must be on that very page). The query plans
relied on are printed (EXPLAIN QUERY PLAN on SQLite; EXPLAIN ANALYZE with buffers on PostgreSQL,
which shows the rows each step really read).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from benchmarks.common import ID_RANGES, Report, Sizes, median, ms, say, timed
from presence.feed import api as feed
from presence.feed.models import Activity, Group
from presence.models import Contact

NAME = "feed"
FIRST_ID = ID_RANGES[NAME].start  # outside the id ranges of the other benchmarks
VIEWER_ID = FIRST_ID
#: a prolific author (2 % of all activities, shared with everyone): the one-person timeline
PROLIFIC_ID = FIRST_ID + 1
GROUP_SIZES = (20, 30, 50, 75, 100, 150, 200, 300, 400, 500, 600, 700, 800, 900, 1000,
               1200, 1400, 1600, 1800, 2000)  # fmt: skip
#: the groups whose timelines are measured: a typical one and a small one
MEASURED_GROUPS = (500, 20)
PAGE = 50
DEEP_PAGE = 20
START = datetime(2030, 1, 1, tzinfo=UTC)
#: one activity every this many seconds, whatever the table size (a steady rate)
STEP = timedelta(seconds=8.64)  # 1,000,000 activities in 100 days
#: activity_visibility of authors: (level or None for no PrivacySettings row, weight)
VISIBILITY = (("everyone", 35), (None, 40), ("close_friends", 15), ("nobody", 10))


@dataclass(frozen=True)
class FeedSizes:
    users: int
    following: int
    small: int
    large: int
    runs: int
    #: the "deep" page measured besides the first
    deep_page: int

    @classmethod
    def for_mode(cls, quick: bool) -> FeedSizes:
        if quick:
            return cls(users=2_000, following=200, small=50_000, large=150_000, runs=5, deep_page=5)
        return cls(
            users=10_000,
            following=1_000,
            small=100_000,
            large=1_000_000,
            runs=15,
            deep_page=DEEP_PAGE,
        )


class AliasRouter:
    """Sends every query to ``alias``, so the same public API runs on each database."""

    alias = "default"

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return self.alias

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return self.alias

    def allow_relation(self, *args: Any, **hints: Any) -> bool:
        return True


@contextmanager
def using(alias: str) -> Iterator[None]:
    AliasRouter.alias = alias
    with override_settings(DATABASE_ROUTERS=[f"{__name__}.AliasRouter"]):
        yield
    AliasRouter.alias = "default"


# --- bulk setup ------------------------------------------------------------------------------


def table(model: Any) -> str:
    return str(model._meta.db_table)


def insert(alias: str, name: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Bulk insert: COPY on PostgreSQL, executemany in one transaction elsewhere."""
    connection = connections[alias]
    quoted = ", ".join(connection.ops.quote_name(c) for c in columns)
    if connection.vendor == "postgresql":
        with (
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY {name} ({quoted}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)
        return
    adapt = connection.ops.adapt_datetimefield_value
    placeholders = ", ".join(["%s"] * len(columns))
    sql = f"INSERT INTO {name} ({quoted}) VALUES ({placeholders})"
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        batch: list[Sequence[Any]] = []
        for row in rows:
            batch.append([adapt(v) if isinstance(v, datetime) else v for v in row])
            if len(batch) == 10_000:
                cursor.executemany(sql, batch)
                batch = []
        if batch:
            cursor.executemany(sql, batch)


@dataclass
class Graph:
    users: list[int]
    followed: list[int]
    groups: dict[int, str] = field(default_factory=dict)  # size -> group slug


def clear(alias: str) -> None:
    """Delete this benchmark's rows (users in its id range and all that hangs on them)."""
    from presence.feed.models import Membership, Mention
    from presence.models import Block, PrivacySettings

    connection = connections[alias]
    low, high = ID_RANGES[NAME].start, ID_RANGES[NAME].stop
    by_user = {
        Mention: "user_id",
        Activity: "author_id",
        Membership: "user_id",
        PrivacySettings: "user_id",
        Contact: "owner_id",
        Block: "blocker_id",
        get_user_model(): "id",
    }
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table(Mention)} WHERE activity_id IN "
            f"(SELECT id FROM {table(Activity)} WHERE author_id >= %s AND author_id < %s)",
            [low, high],
        )
        for model, column in by_user.items():
            cursor.execute(
                f"DELETE FROM {table(model)} WHERE {column} >= %s AND {column} < %s", [low, high]
            )
        cursor.execute(f"DELETE FROM {table(Group)} WHERE slug LIKE 'group-%%'")


def build_graph(alias: str, sizes: FeedSizes) -> Graph:
    from presence.feed.models import Membership
    from presence.models import Block, PrivacySettings

    rnd = random.Random(5)
    ids = list(range(FIRST_ID, FIRST_ID + sizes.users))
    joined = datetime(2029, 1, 1, tzinfo=UTC)
    user_model = get_user_model()
    insert(
        alias,
        table(user_model),
        (
            "id",
            "password",
            "is_superuser",
            "username",
            "first_name",
            "last_name",
            "email",
            "is_staff",
            "is_active",
            "date_joined",
        ),
        ((uid, "!", False, f"fu{uid}", "", "", "", False, True, joined) for uid in ids),
    )
    others = ids[1:]
    levels = [level for level, weight in VISIBILITY for _ in range(weight)]
    privacy = [(uid, "everyone" if uid == PROLIFIC_ID else rnd.choice(levels)) for uid in others]
    insert(
        alias,
        table(PrivacySettings),
        (
            "user_id",
            "online_visibility",
            "last_seen_visibility",
            "activity_visibility",
            "invisible",
        ),
        ((uid, "contacts", "contacts", level, False) for uid, level in privacy if level),
    )
    followed = sorted(rnd.sample(others, sizes.following))
    contacts: dict[tuple[int, int], bool] = {(VIEWER_ID, uid): False for uid in followed}
    for uid in followed[::2]:  # half follow back; a fifth of those: the viewer is a close friend
        contacts[(uid, VIEWER_ID)] = rnd.random() < 0.2
    for uid in others:  # everyone follows a few others, so the contact table has a real size
        for other in rnd.sample(others, 10):
            if other != uid:
                contacts.setdefault((uid, other), False)
    insert(
        alias,
        table(Contact),
        ("owner_id", "contact_id", "close_friend", "created_at"),
        ((owner, contact, close, joined) for (owner, contact), close in contacts.items()),
    )
    blocks = [(VIEWER_ID, uid) for uid in followed[1:10:2]] + [
        (uid, VIEWER_ID) for uid in followed[11:20:2]
    ]
    insert(
        alias,
        table(Block),
        ("blocker_id", "blocked_id", "created_at"),
        ((a, b, joined) for a, b in blocks),
    )
    graph = Graph(users=ids, followed=followed)
    for n, size in enumerate(GROUP_SIZES):
        group = Group.objects.using(alias).create(name=f"Group {n}", slug=f"group-{n}-{size}")
        graph.groups[size] = group.slug
        members = {VIEWER_ID, *rnd.sample(others, size - 1)}
        insert(
            alias,
            table(Membership),
            ("group_id", "user_id", "joined_at"),
            ((group.pk, uid, joined) for uid in members),
        )
    return graph


CHUNK = 10_000


def activity_rows(
    users: list[int], first: int, end: int
) -> tuple[Iterator[tuple[Any, ...]], list[tuple[int, int, datetime]]]:
    """Activities ``first`` to ``end`` (and, filled as they are read, their mentions); the same
    whichever range asks for them (seeded per chunk), so two tables can share their newest."""
    mentions: list[tuple[int, int, datetime]] = []

    def rows() -> Iterator[tuple[Any, ...]]:
        for chunk in range(first // CHUNK, (end + CHUNK - 1) // CHUNK):
            rnd = random.Random(chunk)
            for n in range(chunk * CHUNK, (chunk + 1) * CHUNK):
                author, roll, other = rnd.choice(users), rnd.random(), rnd.choice(users)
                if rnd.random() < 0.02:
                    author = PROLIFIC_ID
                if not first <= n < end:
                    continue
                pk, at, text = FIRST_ID + n, START + STEP * n, f"Activity {n}"
                if roll < 0.03 and author != VIEWER_ID:
                    mentions.append((pk, VIEWER_ID, at))
                    text += f" for @fu{VIEWER_ID}"
                elif roll < 0.23 and other not in (author, VIEWER_ID):
                    mentions.append((pk, other, at))
                    text += f" with @fu{other}"
                yield (pk, author, text, "post", at)

    return rows(), mentions


def add_activities(alias: str, graph: Graph, first: int, end: int) -> float:
    """Write activities ``first`` to ``end``; returns the seconds it took."""
    from presence.feed.models import Mention

    start = time.perf_counter()
    rows, mentions = activity_rows(graph.users, first, end)
    insert(alias, table(Activity), ("id", "author_id", "text", "kind", "created_at"), rows)
    insert(alias, table(Mention), ("activity_id", "user_id", "created_at"), mentions)
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table(Activity)}', 'id'), %s)",
                [FIRST_ID + end],
            )
            # What autovacuum does to a table that grew: statistics, and the visibility map
            # that lets index-only scans skip the heap.
            cursor.execute("VACUUM ANALYZE")
    return time.perf_counter() - start


# --- measuring -------------------------------------------------------------------------------


@dataclass
class Timeline:
    label: str
    page: Callable[[str | None], feed.Page]
    first: list[float] = field(default_factory=list)
    deep: list[float] = field(default_factory=list)
    #: process CPU time of the same calls (on SQLite all of the work: see run_on)
    first_cpu: list[float] = field(default_factory=list)
    deep_cpu: list[float] = field(default_factory=list)
    deep_cursor: str | None = None
    reachable: bool = True


def timelines(alias: str, graph: Graph) -> list[Timeline]:
    """The measured timelines as the viewer sees them, reading ``alias`` (call inside using)."""
    viewer = get_user_model()._default_manager.get(pk=VIEWER_ID)
    found = [
        Timeline(
            f"following ({len(graph.followed):,} followed)",
            lambda c: feed.following_timeline(viewer, cursor=c),
        )
    ]
    for size in MEASURED_GROUPS:
        group = Group.objects.get(slug=graph.groups[size])
        found.append(
            Timeline(
                f"group ({size:,} members)",
                lambda c, g=group: feed.group_timeline(g, viewer, cursor=c),  # type: ignore[misc]
            )
        )
    found.append(Timeline("mentions", lambda c: feed.mentions_timeline(viewer, cursor=c)))
    author = get_user_model()._default_manager.get(pk=PROLIFIC_ID)
    found.append(
        Timeline("one person (prolific)", lambda c: feed.user_timeline(author, viewer, cursor=c))
    )
    return found


def find_deep_cursors(lines: list[Timeline], deep_page: int) -> None:
    for line in lines:
        cursor: str | None = None
        seen: set[int] = set()
        for _ in range(deep_page - 1):
            page = line.page(cursor)
            ids = [a.pk for a in page.activities]
            if seen.intersection(ids) or (len(ids) != PAGE and page.next_cursor is not None):
                raise RuntimeError(f"{line.label}: a page repeated activities or came up short")
            seen.update(ids)
            cursor = page.next_cursor
            if cursor is None:
                break
        line.deep_cursor = cursor
        line.reachable = cursor is not None


def timed_on(alias: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    with using(alias):
        return timed(fn)


def timed_cpu_on(alias: str, fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall time and this process's CPU time of one call."""
    with using(alias):
        cpu = time.process_time()
        wall, _ = timed(fn)
        return wall, time.process_time() - cpu


def measure(pairs: list[tuple[Timeline, Timeline]], aliases: tuple[str, str], runs: int) -> None:
    """Time each page on both databases alternately (the order flips every round)."""
    for n in range(runs + 1):  # round 0 warms up: connections, caches
        order = list(zip(aliases, (0, 1), strict=True))
        if n % 2:
            order.reverse()
        for pair in pairs:
            for alias, side in order:
                line = pair[side]
                wall, cpu = timed_cpu_on(alias, lambda: line.page(None))  # noqa: B023
                if n:
                    line.first.append(wall)
                    line.first_cpu.append(cpu)
                if line.reachable:
                    wall, cpu = timed_cpu_on(alias, lambda: line.page(line.deep_cursor))  # noqa: B023
                    if n:
                        line.deep.append(wall)
                        line.deep_cpu.append(cpu)


def same_pages(alias_small: str, alias_large: str, pairs: list[tuple[Timeline, Timeline]]) -> None:
    """The small table's activities are the large one's newest: a full page must come out the
    same from both, and a short one (the small table ran out) must begin the large one's."""
    for small, large in pairs:
        both = small.reachable and large.reachable
        if both and small.deep_cursor != large.deep_cursor:
            raise RuntimeError(f"{small.label}: the cursors differ between the two databases")
        for cursor in [None] + ([small.deep_cursor] if both else []):
            _, a = timed_on(alias_small, lambda: small.page(cursor))  # noqa: B023
            _, b = timed_on(alias_large, lambda: large.page(cursor))  # noqa: B023
            a_ids, b_ids = [x.pk for x in a.activities], [x.pk for x in b.activities]
            if a_ids != b_ids[: len(a_ids)] or (len(a_ids) < PAGE and a.next_cursor):
                raise RuntimeError(f"{small.label}: the two databases gave different pages")


@dataclass
class FollowCost:
    #: a first page of the following timeline, nothing changed before it
    plain: float
    #: the same page loaded right after a follow (the follow itself not included)
    after_follow: float
    #: the follow: one Contact row written (INSERT, commit, presence's change signal)
    follow: float
    #: follows whose author's newest activity was on the very next page
    checked: int


def follow_then_page(graph: Graph, runs: int) -> FollowCost:
    """A first page of the following timeline right after a follow vs one without a follow,
    alternately; checks that the newly followed author's newest activity is on that page."""
    user_model = get_user_model()
    viewer = user_model._default_manager.get(pk=VIEWER_ID)
    followed = set(graph.followed)
    blocked = {VIEWER_ID} | set(graph.followed[1:20])
    everyone = set(
        user_model._default_manager.filter(
            pk__gte=FIRST_ID, presence_privacy__activity_visibility="everyone"
        ).values_list("pk", flat=True)
    )
    # The authors of the newest activities: their newest activity belongs on the first page.
    candidates: list[int] = []
    for author in Activity.objects.order_by("-created_at", "-id").values_list(
        "author_id", flat=True
    )[:5000]:
        if author in everyone and author not in followed | blocked and author not in candidates:
            candidates.append(author)
        if len(candidates) == runs:
            break

    def read() -> feed.Page:
        return feed.following_timeline(viewer)

    plain: list[float] = []
    after: list[float] = []
    follows: list[float] = []
    checked = 0
    read()  # warm
    for n, target in enumerate(candidates):
        if n % 2:
            plain.append(timed(read)[0])
        elapsed, _ = timed(
            lambda target=target: Contact.objects.create(owner_id=VIEWER_ID, contact_id=target)
        )
        follows.append(elapsed)
        elapsed, page = timed(read)
        after.append(elapsed)
        if not n % 2:
            plain.append(timed(read)[0])  # (still following: the same page, nothing changed)
        newest = Activity.objects.filter(author=target).order_by("-created_at", "-id").first()
        if newest is None or newest.pk not in {a.pk for a in page.activities}:
            raise RuntimeError("a follow did not show on the very next page")
        checked += 1
        Contact.objects.filter(owner_id=VIEWER_ID, contact_id=target).delete()
    return FollowCost(median(plain), median(after), median(follows), checked)


# --- query plans -----------------------------------------------------------------------------


def explain(alias: str, sql: str) -> list[str]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + sql)
            return [row[0] for row in cursor.fetchall()]
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        return [("  " * _depth(row)) + str(row[-1]) for row in cursor.fetchall()]


_parents: dict[int, int] = {}


def _depth(row: Sequence[Any]) -> int:
    node, parent = int(row[0]), int(row[1])
    depth = 0 if parent == 0 else _parents.get(parent, 0) + 1
    _parents[node] = depth
    return depth


def show_plans(alias: str, lines: list[Timeline], deep_page: int) -> None:
    for line in lines:
        with CaptureQueriesContext(connections[alias]) as queries:
            line.page(line.deep_cursor if line.reachable else None)
        say(f"  plans: {line.label}, page {deep_page if line.reachable else 1}:")
        for n, query in enumerate(queries.captured_queries, 1):
            sql = query["sql"]
            say(f"   query {n}: {sql[:160]}{'...' if len(sql) > 160 else ''}")
            for row in explain(alias, sql):
                say(f"      {row}")


# --- the run ---------------------------------------------------------------------------------


def database_pairs() -> list[tuple[str, str]]:
    """(large, small) aliases of each database kind configured (benchmarks/settings.py)."""
    pairs = [("default", "feed_small")]
    if "postgres" in settings.DATABASES:
        pairs.append(("postgres", "postgres_small"))
    return pairs


def vendor(alias: str) -> str:
    return "PostgreSQL" if connections[alias].vendor == "postgresql" else "SQLite"


def run_on(large_alias: str, small_alias: str, sizes: FeedSizes, report: Report) -> None:
    db = vendor(large_alias)
    say(f"\n-- {db} --")
    graphs: dict[str, Graph] = {}
    for alias, first in ((small_alias, sizes.large - sizes.small), (large_alias, 0)):
        with using(alias):
            clear(alias)
            elapsed, graphs[alias] = timed(lambda: build_graph(alias, sizes))  # noqa: B023
            written = add_activities(alias, graphs[alias], first, sizes.large)
        say(
            f"  setup ({alias}): {sizes.users:,} users, the viewer following "
            f"{sizes.following:,} and in {len(GROUP_SIZES)} groups in {elapsed:.1f} s; "
            f"{sizes.large - first:,} activities in {written:.1f} s (not measured)"
        )
    lines: dict[str, list[Timeline]] = {}
    for alias in (small_alias, large_alias):
        with using(alias):
            lines[alias] = timelines(alias, graphs[alias])
            find_deep_cursors(lines[alias], sizes.deep_page)
    pairs = list(zip(lines[small_alias], lines[large_alias], strict=True))
    same_pages(small_alias, large_alias, pairs)
    say("  the same pages come out of both databases (checked)")
    measure(pairs, (small_alias, large_alias), sizes.runs)
    growth = f"{sizes.small // 1000:,}k → {sizes.large // 1000:,}k"
    # SQLite runs in this process, so its CPU time is the whole cost and other processes
    # cannot inflate it: the judged figure there. PostgreSQL works in its own processes: wall.
    in_process = connections[large_alias].vendor == "sqlite"
    for small, large in pairs:
        rows = [("first page", small.first, large.first, small.first_cpu, large.first_cpu)]
        if small.reachable and large.reachable:
            rows.append(
                (f"page {sizes.deep_page}", small.deep, large.deep, small.deep_cpu, large.deep_cpu)
            )
        for what, a, b, a_cpu, b_cpu in rows:
            wall_ratio = median(b) / median(a)
            cpu_ratio = median(b_cpu) / median(a_cpu) if median(a_cpu) else float("nan")
            ratio = cpu_ratio if in_process else wall_ratio
            detail = (
                f"wall {ms(median(a))} → {ms(median(b))} ({wall_ratio:.2f}x); CPU "
                f"{ms(median(a_cpu))} → {ms(median(b_cpu))}"
                if in_process
                else f"{ms(median(a))} → {ms(median(b))}"
            )
            report.add(
                NAME,
                f"{db}: {large.label}, {what}, {growth} activities: {detail}",
                f"{ratio:.2f}x",
                "≤ 2x",
                ratio <= 2,
            )
    with using(large_alias):
        cost = follow_then_page(graphs[large_alias], sizes.runs)
    ratio = cost.after_follow / cost.plain
    report.add(
        NAME,
        f"{db}: following page right after a follow vs any page ({ms(cost.after_follow)} vs "
        f"{ms(cost.plain)}; the new author's activity on it {cost.checked} times of "
        f"{cost.checked}; the follow itself {ms(cost.follow)})",
        f"{ratio:.2f}x",
        "≈ 1x (≤ 1.5x)",
        ratio <= 1.5,
    )
    with using(large_alias):
        show_plans(large_alias, lines[large_alias], sizes.deep_page)
    for alias in (small_alias, large_alias):
        clear(alias)


def run(sizes: Sizes, report: Report) -> None:
    feed_sizes = FeedSizes.for_mode(report.quick)
    say(
        f"\n== feed: {feed_sizes.users:,} users; {feed_sizes.small:,} vs {feed_sizes.large:,} "
        f"activities side by side; pages of {PAGE} =="
    )
    for large_alias, small_alias in database_pairs():
        run_on(large_alias, small_alias, feed_sizes, report)
