"""The simulated population: users, a power-law social graph, a privacy mix and some blocks,
seeded in bulk (raw multi-row inserts on SQLite, COPY on PostgreSQL).

The graph's shape is pure (:func:`contact_degrees`, :func:`build_graph`) and unit-tested; only
:func:`seed` touches the database.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: the tail exponent of the contact counts: a few users have hundreds of times the median
PARETO_ALPHA = 3.0
#: share of each user's contacts drawn from the popular users (their followers pile up)
POPULAR_SHARE = 0.2
#: chance that a follow is returned (friends are mutual contacts)
RECIPROCITY = 0.3
#: privacy mix: (online, last seen, activity) visibility and its share of users
PRIVACY_MIX: tuple[tuple[str, float], ...] = (
    ("contacts", 0.55),
    ("everyone", 0.25),
    ("close_friends", 0.10),
    ("nobody", 0.05),
    ("invisible", 0.05),
)


def contact_degrees(
    users: int, median: int, maximum: int, hubs: int, rng: random.Random
) -> list[int]:
    """Contacts per user: a Pareto law with the given median, capped at ``maximum`` (and at the
    number of other users), with ``hubs`` users at the cap."""
    cap = min(maximum, users - 1)
    scale = median / 2 ** (1 / PARETO_ALPHA)  # the median of Pareto(scale, alpha)
    degrees = [min(cap, int(scale * rng.paretovariate(PARETO_ALPHA))) for _ in range(users)]
    for index in rng.sample(range(users), min(hubs, users)):
        degrees[index] = cap
    return degrees


@dataclass
class Graph:
    """Everything seeded, by user index (0..users-1; user pk = index + first pk)."""

    users: int
    contacts: list[set[int]]
    close_friends: set[tuple[int, int]]
    #: user -> "contacts" | "everyone" | "close_friends" | "nobody" | "invisible"
    privacy: dict[int, str]
    blocks: set[tuple[int, int]]
    #: users whose every visibility is "nobody" and stays so: no one else may ever see them
    hidden: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(len(c) for c in self.contacts)

    def blocked_pairs(self) -> set[tuple[int, int]]:
        """(viewer, target) pairs a seeded block hides from each other, both ways."""
        return self.blocks | {(b, a) for a, b in self.blocks}


def build_graph(
    users: int, median: int, maximum: int, hubs: int, hidden: int, seed: int = 11
) -> Graph:
    rng = random.Random(seed)
    # Returned follows add about RECIPROCITY of a user's own count: aim below the median.
    degrees = contact_degrees(users, int(median / (1 + RECIPROCITY)), maximum, hubs, rng)
    popular = rng.sample(range(users), max(1, users // 100))
    contacts: list[set[int]] = [set() for _ in range(users)]
    for owner, degree in enumerate(degrees):
        chosen = contacts[owner]
        from_popular = min(int(degree * POPULAR_SHARE), len(popular))
        chosen.update(rng.sample(popular, from_popular))
        # Uniform draws for the rest; bounded retries (duplicates and self are skipped).
        for _ in range(4):
            missing = degree - len(chosen)
            if missing <= 0:
                break
            chosen.update(rng.sample(range(users), min(users, missing + 1)))
            chosen.discard(owner)
        while len(chosen) > degree:
            chosen.pop()
    for owner in range(users):
        for contact in list(contacts[owner]):
            if rng.random() < RECIPROCITY and len(contacts[contact]) < maximum:
                contacts[contact].add(owner)
    close_friends = {
        (owner, contact)
        for owner in range(users)
        for contact in contacts[owner]
        if rng.random() < 0.1
    }
    weights = [share for _, share in PRIVACY_MIX]
    names = [name for name, _ in PRIVACY_MIX]
    privacy = {user: rng.choices(names, weights)[0] for user in range(users)}
    hidden_users = rng.sample(range(users), min(hidden, users))
    for user in hidden_users:
        privacy[user] = "nobody"
    blocks: set[tuple[int, int]] = set()
    for blocker in rng.sample(range(users), max(1, users // 100)):
        for blocked in rng.sample(range(users), 3):
            if blocked != blocker and (blocked, blocker) not in blocks:
                blocks.add((blocker, blocked))
    return Graph(users, contacts, close_friends, privacy, blocks, hidden_users)


def median_degree(graph: Graph) -> float:
    return statistics.median(len(c) for c in graph.contacts)


# --- the database ---------------------------------------------------------------------------


def _chunks(rows: list[tuple[Any, ...]], size: int) -> Iterator[list[tuple[Any, ...]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _insert(table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Many rows fast: COPY on PostgreSQL, executemany on SQLite's own connection."""
    from django.db import connection

    if not rows:
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            raw = cursor.cursor
            with raw.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        return
    connection.ensure_connection()
    raw_connection = connection.connection
    marks = ", ".join("?" * len(columns))
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
    # One transaction: Django keeps SQLite in autocommit, which would sync every row.
    raw_connection.execute("BEGIN")
    try:
        for chunk in _chunks(rows, 50_000):
            raw_connection.executemany(sql, chunk)
    except BaseException:
        raw_connection.execute("ROLLBACK")
        raise
    raw_connection.execute("COMMIT")


@dataclass
class Seeded:
    graph: Graph
    #: user pk by index
    pks: list[int]
    seconds: float


def seed(graph: Graph) -> Seeded:
    """Users u0..uN with one (MD5) password, their contacts, privacy settings and blocks."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.db import transaction

    from presence.models import Block, Contact, PrivacySettings, UserStatus

    started = time.monotonic()
    user_model = get_user_model()
    password = make_password("loadtest")
    with transaction.atomic():
        user_model.objects.bulk_create(
            [user_model(username=f"u{i}", password=password) for i in range(graph.users)],
            batch_size=2_000,
        )
    by_name = dict(user_model.objects.values_list("username", "pk"))
    pks = [by_name[f"u{i}"] for i in range(graph.users)]
    now = datetime.now(tz=UTC)
    contact_rows = [
        (pks[owner], pks[contact], (owner, contact) in graph.close_friends, now)
        for owner in range(graph.users)
        for contact in graph.contacts[owner]
    ]
    _insert(
        Contact._meta.db_table,
        ("owner_id", "contact_id", "close_friend", "created_at"),
        contact_rows,
    )
    privacy_rows = []
    for user, kind in graph.privacy.items():
        if kind == "contacts":
            continue  # the defaults: no row
        invisible = kind == "invisible"
        level = "contacts" if invisible else kind
        privacy_rows.append((pks[user], level, level, level, invisible))
    _insert(
        PrivacySettings._meta.db_table,
        (
            "user_id",
            "online_visibility",
            "last_seen_visibility",
            "activity_visibility",
            "invisible",
        ),
        privacy_rows,
    )
    # Everyone starts with a status text "t=0": a client measures the fan-out latency from one
    # stamp to the next, never from a text that only became visible (a follow, a privacy change).
    _insert(
        UserStatus._meta.db_table,
        ("user_id", "dnd", "text", "emoji", "activity", "updated_at"),
        [(pk, False, "t=0", "", "", now) for pk in pks],
    )
    _insert(
        Block._meta.db_table,
        ("blocker_id", "blocked_id", "created_at"),
        [(pks[a], pks[b], now) for a, b in graph.blocks],
    )
    # Fresh statistics for the planner: after a bulk load PostgreSQL has none (and would scan
    # the contacts table for every relation query), SQLite's are from the empty tables.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return Seeded(graph, pks, time.monotonic() - started)


def session_cookie(user: Any) -> str:
    """A signed-cookie session logging ``user`` in (tools.loadtest.settings uses that engine)."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.signed_cookies import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return str(session.session_key)
