"""The demo's people and how they relate, shared by ``seed_demo`` and the login page's hint."""

from __future__ import annotations

DEMO_PASSWORD = "presence-demo"

#: username -> (first name, last name)
DEMO_USERS: dict[str, tuple[str, str]] = {
    "alice": ("Alice", "Anders"),
    "bob": ("Bob", "Brown"),
    "carol": ("Carol", "Chen"),
    "dave": ("Dave", "Dang"),
    "erin": ("Erin", "Endo"),
    "frank": ("Frank", "Fischer"),
}

#: mutual contacts (friends)
FRIENDS = [
    ("alice", "bob"),
    ("alice", "carol"),
    ("alice", "dave"),
    ("bob", "carol"),
    ("carol", "erin"),
]

#: one-way contacts: (follower, followed)
FOLLOWS = [("erin", "alice"), ("frank", "bob")]

#: (owner, contact) the owner marked a close friend
CLOSE_FRIENDS = [("bob", "alice")]

#: (blocker, blocked)
BLOCKS = [("bob", "frank")]

#: privacy settings different from the defaults (contacts for all three, not invisible)
PRIVACY: dict[str, dict[str, object]] = {
    "dave": {"last_seen_visibility": "nobody"},
    "erin": {"online_visibility": "everyone", "last_seen_visibility": "everyone"},
    # bob's custom status is for close friends only: alice sees it, carol does not.
    "bob": {"activity_visibility": "close_friends"},
}

#: custom statuses, set through presence.api.set_status: username -> (status, text, emoji)
STATUSES: dict[str, tuple[str, str | None, str | None]] = {
    "carol": ("auto", "Deep in a deadline", "📚"),
    "bob": ("dnd", "In a meeting until 3", "📅"),
}

#: last seen this many seconds ago, so the demo shows last-seen strings before anyone logs in
LAST_SEEN_AGO: dict[str, int] = {
    "bob": 12 * 60,
    "carol": 2 * 3600,
    "dave": 26 * 3600,
    "erin": 3 * 86400,
    "frank": 40 * 86400,
}
