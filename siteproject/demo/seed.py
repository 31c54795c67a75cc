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

#: groups: slug -> (name, description, members)
GROUPS: dict[str, tuple[str, str, list[str]]] = {
    "book-club": (
        "Book club",
        "One book a month, discussed on Sundays.",
        ["alice", "bob", "carol"],
    ),
    "climbers": ("Climbers", "Bouldering after work.", ["alice", "dave", "erin", "frank"]),
}

#: posts, oldest first: (author, text with @mentions, minutes ago); bob shares his activity
#: with close friends only (PRIVACY), so alice sees his posts and carol does not
POSTS: list[tuple[str, str, int]] = [
    ("carol", "Finished the first half of the book. No spoilers please, @alice!", 26 * 60),
    ("alice", "@carol deal. @bob, are you in for Sunday?", 25 * 60),
    ("bob", "In for Sunday, @alice. Bringing snacks.", 24 * 60),
    ("dave", "New problems set at the gym: @erin the purple one is yours.", 5 * 60),
    ("erin", "@dave sent it on the third try. Who else is coming on Thursday?", 3 * 60),
    ("frank", "Thursday works for me. @alice?", 2 * 60),
    (
        "alice",
        "Thursday it is, @frank and @erin. Mail me at alice@example.com for the address.",
        50,
    ),
]
