"""What the feed's tests expect, worked out independently of presence.feed.

Who may see an author's activities comes from the small ``ADMITS`` table of
``tests.privacy_cases`` (written from the rules in docs/privacy.md, never by calling
``presence.domain.permits``), and timelines are recomputed by brute force in Python from every
row of the database, so a mistake in the feed's SQL cannot hide behind the same mistake here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from presence.feed.models import Activity, Group, Membership, Mention
from presence.models import Block, Contact, PrivacySettings
from tests.privacy_cases import ADMITS

#: None: the author has no PrivacySettings row (the default, "contacts")
LEVELS: tuple[str | None, ...] = (None, "everyone", "contacts", "close_friends", "nobody")
RELATIONS = (
    "self",
    "contact",  # the author has the viewer among its contacts
    "close_friend",  # ... and marked the viewer a close friend
    "stranger",  # the viewer follows the author, not the other way round
    "blocked_by_author",  # close friends both ways, then the author blocked the viewer
    "blocking_author",  # close friends both ways, then the viewer blocked the author
    "anonymous",
)
FEED_CASES = [(level, relation) for level in LEVELS for relation in RELATIONS]
FEED_CASE_IDS = [f"{level or 'default'}-{relation}" for level, relation in FEED_CASES]


def admitted(level: str | None, relation: str) -> bool:
    """Whether a viewer in ``relation`` to the author sees activities at ``level``."""
    if relation == "self":
        return True
    if relation in {"blocked_by_author", "blocking_author"}:
        return False
    return relation in ADMITS[level or "contacts"]


@dataclass
class FeedScenario:
    author: Any
    #: None for an anonymous viewer
    viewer: Any
    group: Group
    activity: Activity


def build_case(level: str | None, relation: str, make_user: Callable[..., Any]) -> FeedScenario:
    """An author with ``level``, a viewer in ``relation`` to them (following them, in one group
    with them) and one activity of the author mentioning the viewer."""
    author = make_user()
    viewer: Any
    if relation == "self":
        viewer = author
    elif relation == "anonymous":
        viewer = None
    else:
        viewer = make_user()
        Contact.objects.create(owner=viewer, contact=author)
        if relation != "stranger":
            Contact.objects.create(owner=author, contact=viewer, close_friend=relation != "contact")
        if relation == "blocked_by_author":
            Block.objects.create(blocker=author, blocked=viewer)
        elif relation == "blocking_author":
            Block.objects.create(blocker=viewer, blocked=author)
    if level is not None:
        PrivacySettings.objects.create(user=author, activity_visibility=level)
    group = Group.objects.create(name="Case", slug=f"case-{author.pk}")
    for member in {author, viewer} - {None}:
        Membership.objects.create(group=group, user=member)
    activity = Activity.objects.create(author=author, text="hello")
    if viewer is not None:
        activity.text = f"hello @{viewer.username}"
        activity.save()
        Mention.objects.create(activity=activity, user=viewer, created_at=activity.created_at)
    return FeedScenario(author, viewer, group, activity)


# --- brute force ----------------------------------------------------------------------------


class World:
    """Every row that decides a timeline, read once; timelines recomputed in Python."""

    def __init__(self) -> None:
        self.contacts = {(c.owner_id, c.contact_id): c.close_friend for c in Contact.objects.all()}
        self.blocks = set(Block.objects.values_list("blocker_id", "blocked_id"))
        self.levels = dict(PrivacySettings.objects.values_list("user_id", "activity_visibility"))
        self.members: dict[int, set[int]] = {}
        for group_id, user_id in Membership.objects.values_list("group_id", "user_id"):
            self.members.setdefault(group_id, set()).add(user_id)
        self.mentions: dict[int, set[int]] = {}
        for activity_id, user_id in Mention.objects.values_list("activity_id", "user_id"):
            self.mentions.setdefault(user_id, set()).add(activity_id)
        self.activities = sorted(
            Activity.objects.values_list("created_at", "id", "author_id"), reverse=True
        )

    def relation(self, author: int, viewer: int | None) -> str:
        if viewer is None:
            return "anonymous"
        if author == viewer:
            return "self"
        if (author, viewer) in self.blocks or (viewer, author) in self.blocks:
            return "blocked_by_author"
        if (author, viewer) not in self.contacts:
            return "stranger"
        return "close_friend" if self.contacts[(author, viewer)] else "contact"

    def sees(self, viewer: int | None, author: int) -> bool:
        return admitted(self.levels.get(author), self.relation(author, viewer))

    def timeline(self, authors: Callable[[int], bool], viewer: int | None) -> list[int]:
        return [
            pk for _, pk, author in self.activities if authors(author) and self.sees(viewer, author)
        ]

    def user(self, author: int, viewer: int | None) -> list[int]:
        return self.timeline(lambda a: a == author, viewer)

    def following(self, viewer: int, include_self: bool = False) -> list[int]:
        followed = {c for (o, c) in self.contacts if o == viewer}
        if include_self:
            followed.add(viewer)
        return self.timeline(followed.__contains__, viewer)

    def group(self, group: int, viewer: int | None) -> list[int]:
        return self.timeline(self.members.get(group, set()).__contains__, viewer)

    def mentioning(self, viewer: int) -> list[int]:
        mine = self.mentions.get(viewer, set())
        return [pk for _, pk, author in self.activities if pk in mine and self.sees(viewer, author)]


def page_through(fetch: Callable[[str | None], Any], limit_check: int) -> list[int]:
    """Every activity id of a timeline, following cursors to the end; checks page sizes."""
    ids: list[int] = []
    cursor: str | None = None
    for _ in range(10_000):
        page = fetch(cursor)
        if page.next_cursor is not None:
            assert len(page.activities) == limit_check, "a page before the last came up short"
        ids += [activity.pk for activity in page.activities]
        cursor = page.next_cursor
        if cursor is None:
            return ids
    raise AssertionError("paging did not end")


# --- PRESENCE_FEED["CAN_READ"] rules (named by dotted path in the tests' settings) -----------


def members_read_groups(user: Any, feed: str) -> bool:
    """A site whose groups are private: a group's timeline to its members only."""
    if not feed.startswith("group:"):
        return True
    return Membership.objects.filter(group__slug=feed[6:], user=user).exists()


def reads_nothing(user: Any, feed: str) -> bool:
    return False


def rule_that_raises(user: Any, feed: str) -> bool:
    raise RuntimeError("a bug in the site's rule")


def staff_read_groups(user: Any, feed: str) -> bool:
    """A site rule on facts of the site's own (is_staff), which the feed does not watch: the
    site calls recheck_watches when they change. Read from the database, as a rule does."""
    if not feed.startswith("group:"):
        return True
    return type(user)._default_manager.filter(pk=user.pk, is_staff=True).exists()


def contacts_read_users(user: Any, feed: str) -> bool:
    """A user's timeline to the users they added as contacts only (and to themselves)."""
    if not feed.startswith("user:"):
        return True
    owner = feed[5:]
    return str(user.pk) == owner or Contact.objects.filter(owner=owner, contact=user).exists()


#: every (user's pk, feed) recorded_members_read_groups was asked, in order (a test clears it)
rule_calls: list[tuple[Any, str]] = []


def recorded_members_read_groups(user: Any, feed: str) -> bool:
    """members_read_groups, recording each call: which names the rule is asked about."""
    rule_calls.append((getattr(user, "pk", None), feed))
    return members_read_groups(user, feed)


#: the dotted paths of the rules above
MEMBERS_READ_GROUPS = f"{__name__}.members_read_groups"
RECORDED_MEMBERS_READ_GROUPS = f"{__name__}.recorded_members_read_groups"
READS_NOTHING = f"{__name__}.reads_nothing"
RULE_THAT_RAISES = f"{__name__}.rule_that_raises"
STAFF_READ_GROUPS = f"{__name__}.staff_read_groups"
CONTACTS_READ_USERS = f"{__name__}.contacts_read_users"
