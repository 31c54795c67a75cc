"""Which viewers a change can show anything to (presence.domain.Change.seen_by): the pure rule
that keeps a blocked or non-permitted viewer from being told that a user did something.

The rule is held to the resolver itself: over every privacy level, invisibility, relation and
exception, a change judged unseen by a viewer never alters what the one resolver shows that
viewer; and the rule is no gag: each kind is seen by some viewer whose view it alters.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from presence import announce, domain
from presence.domain import (
    EXCEPTION_ALLOW,
    EXCEPTION_DENY,
    EXCEPTION_SHIFT,
    LEVELS,
    Change,
    Choices,
    Device,
    Kind,
    LiveState,
    Relation,
    Timing,
    Visibility,
)
from tests.core.domain_cases import NOW

TIMING = Timing(online_window=300, offline_grace=5, approximate_last_seen=True)
VIEWER = 7
OFFLINE = LiveState(last_active=NOW - 3 * 86400, prior=NOW - 5 * 86400)
ONLINE = LiveState(last_active=NOW - 10, devices=(Device.WEB,), prior=NOW - 5 * 86400)
IDLE = replace(ONLINE, connected=True, idle=True)
#: offline since ten seconds (its ONLINE_WINDOW over): the sweep may not have announced it yet
JUST_OFFLINE = replace(ONLINE, last_active=NOW - TIMING.online_window - 10)
#: views older than this were told of every end before it (a page's socket: the sweep's lag)
SETTLED = NOW - domain.END_NEWS_LAG


def relations() -> Iterator[Relation]:
    for contact, close, blocked in itertools.product((False, True), repeat=3):
        if close and not contact:
            continue
        yield Relation(is_contact=contact, is_close_friend=close, blocked=blocked)
    for setting, bit in itertools.product(EXCEPTION_SHIFT, (EXCEPTION_ALLOW, EXCEPTION_DENY)):
        yield Relation(exceptions=bit << EXCEPTION_SHIFT[setting])
    # RECIPROCAL_LAST_SEEN: a viewer who hides its own last seen sees only the approximate one
    yield Relation(hides_own_last_seen=True)
    yield Relation(is_contact=True, hides_own_last_seen=True)


def choices() -> Iterator[Choices]:
    for online, last_seen, activity in itertools.product(Visibility, repeat=3):
        for invisible in (False, True):
            yield Choices(
                online_visibility=online,
                last_seen_visibility=last_seen,
                activity_visibility=activity,
                invisible=invisible,
            )


def changes_of(
    kind: str, before: Choices
) -> Iterator[tuple[LiveState, Choices, LiveState, Choices, Change]]:
    """(live, choices) before and after, and the change as announced, for changes of ``kind``."""
    if kind == "live":
        for was, now in itertools.permutations((OFFLINE, ONLINE, IDLE), 2):
            yield was, before, now, before, domain.LIVE_CHANGE
        yield ONLINE, before, ONLINE, replace(before, dnd=not before.dnd), domain.LIVE_CHANGE
    elif kind == "activity":
        texted = replace(before, text="at lunch", emoji="🥪", activity="eating")
        for live in (OFFLINE, ONLINE):
            yield live, before, live, texted, domain.ACTIVITY_CHANGE
            yield live, texted, live, before, domain.ACTIVITY_CHANGE
    elif kind == "invisible":
        after = replace(before, invisible=not before.invisible)
        for live in (OFFLINE, ONLINE):
            yield live, before, live, after, domain.levels_change(before, after)
    elif kind == "levels":
        # Each setting to each other level, and online and last seen together.
        texted = replace(before, text="at lunch")
        for setting in (*domain.VISIBILITY_SETTINGS, "both"):
            for level in Visibility:
                names = domain.VISIBILITY_SETTINGS[:2] if setting == "both" else (setting,)
                after = replace(texted, **dict.fromkeys(names, level))
                for live in (OFFLINE, ONLINE):
                    yield live, texted, live, after, domain.levels_change(texted, after)


def resolved(live: LiveState, choices: Choices, relation: Relation) -> domain.Presence:
    return domain.resolve(live, choices, relation, NOW, TIMING)


@pytest.mark.parametrize("kind", ["live", "activity", "invisible", "levels"])
def test_a_change_judged_unseen_never_alters_what_the_viewer_is_shown(kind: str) -> None:
    judged = told = 0
    for relation, before in itertools.product(relations(), choices()):
        for live_before, choices_before, live_after, choices_after, change in changes_of(
            kind, before
        ):
            shown_before = resolved(live_before, choices_before, relation)
            shown_after = resolved(live_after, choices_after, relation)
            if change.seen_by(VIEWER, choices_after, relation):
                told += shown_before != shown_after
            else:
                judged += 1
                assert shown_before == shown_after, (relation, choices_before, choices_after)
    # Both branches are taken: some viewers are spared it, and some that see it are told.
    assert judged and told


#: the live state and custom status of a user: offline since long or online; offline since
#: ten seconds (not announced yet); a custom status without an end, one that ended long ago
#: (its row stays until presence_cleanup; the resolver hides it), one that ended ten seconds ago
STATES = (
    (OFFLINE, {}),
    (OFFLINE, {"text": "at lunch"}),
    (OFFLINE, {"text": "at lunch", "expires_at": NOW - 3600}),
    (JUST_OFFLINE, {"text": "at lunch", "expires_at": NOW - 10}),
    (ONLINE, {"text": "at lunch"}),
    (ONLINE, {"text": "at lunch", "expires_at": NOW - 3600}),
)
#: the levels of these tests (close friends are the older tests')
SOME_LEVELS = (Visibility.EVERYONE, Visibility.CONTACTS, Visibility.NOBODY)
#: the edits two changes merged are made of (a stamp's span, a coalesced delivery)
EDITS = ({"invisible": None}, *({setting: Visibility.NOBODY} for setting in EXCEPTION_SHIFT))
EDITS += ({"online_visibility": Visibility.EVERYONE},)


def edited(choices: Choices, edit: dict) -> Choices:
    if "invisible" in edit:
        return replace(choices, invisible=not choices.invisible)
    return replace(choices, **edit)


def changes_with_ends(kind: str) -> Iterator[tuple[Choices, Choices, Change]]:
    """Choices before and after, and the change as announced (two merged, for "twice")."""
    for online, last_seen, activity in itertools.product(SOME_LEVELS, repeat=3):
        for invisible in (False, True):
            before = Choices(
                online_visibility=online,
                last_seen_visibility=last_seen,
                activity_visibility=activity,
                invisible=invisible,
            )
            if kind == "twice":
                for first, second in itertools.product(EDITS, repeat=2):
                    middle = edited(before, first)
                    after = edited(middle, second)
                    merged = domain.levels_change(before, middle)
                    yield before, after, merged.merged(domain.levels_change(middle, after))
                continue
            turned = edited(before, {"invisible": None}) if "invisible" in kind else before
            for setting, level in itertools.product(domain.VISIBILITY_SETTINGS, SOME_LEVELS):
                after = replace(turned, **{setting: level}) if "levels" in kind else turned
                yield before, after, domain.levels_change(before, after)
                if "levels" not in kind:
                    break


@pytest.mark.parametrize("kind", ["invisible", "levels", "levels and invisible", "twice"])
def test_a_change_judged_unseen_by_what_ended_never_alters_what_the_viewer_is_shown(
    kind: str,
) -> None:
    """Judged with what ended (a turn offline, a custom status's end) long enough ago that every
    view shows it, a change told no one alters no view: the online level or invisibility of a
    user offline since then, the activity level of a custom status over since then."""
    judged = told = 0
    for live, status in STATES:
        cases = [
            (replace(before, **status), replace(after, **status), change)
            for before, after, change in changes_with_ends(kind)
        ]
        for relation in relations():
            for before, after, change in cases:
                shown_before = resolved(live, before, relation)
                shown_after = resolved(live, after, relation)
                ended = domain.ended_of(live, after, SETTLED, TIMING)
                if change.seen_by(VIEWER, after, relation, ended):
                    told += shown_before != shown_after
                else:
                    judged += 1
                    assert shown_before == shown_after, (relation, live, before, after)
    assert judged and told


def test_what_ended_counts_from_the_time_every_view_shows_it() -> None:
    assert domain.ended_of(OFFLINE, Choices(), SETTLED, TIMING) == domain.Ended(offline=True)
    # Never online (Redis holds nothing of the user) is offline since ever.
    assert domain.ended_of(LiveState(), Choices(), SETTLED, TIMING).offline
    for live in (ONLINE, IDLE, JUST_OFFLINE):
        assert not domain.ended_of(live, Choices(), SETTLED, TIMING).offline
    # The live state not known: nothing is known to have ended of it.
    assert domain.ended_of(None, Choices(), SETTLED, TIMING) == domain.NOTHING_ENDED
    for expires_at, over in ((None, False), (NOW + 60, False), (NOW - 10, False), (NOW - 61, True)):
        texted = Choices(text="at lunch", expires_at=expires_at)
        assert domain.ended_of(None, texted, SETTLED, TIMING).custom_status is over


def test_an_offline_user_going_invisible_is_told_only_where_it_shows_something() -> None:
    """Invisible hides the online status, the devices and the exact last seen: an offline user
    shows a stranger who may not see their last seen "offline" either way (and the same
    approximate last seen), so that stranger is not told they went invisible, nor back."""
    stranger, hides_own = Relation(), Relation(hides_own_last_seen=True)
    after = Choices(
        online_visibility=Visibility.EVERYONE,
        last_seen_visibility=Visibility.NOBODY,
        invisible=True,
    )
    for before, now in (
        (replace(after, invisible=False), after),
        (after, replace(after, invisible=False)),
    ):
        change = domain.levels_change(before, now)
        long_offline = domain.ended_of(OFFLINE, now, SETTLED, TIMING)
        assert not change.seen_by(VIEWER, now, stranger, long_offline)
        # Its exact last seen shown (to a viewer not hiding its own): hidden, or shown again.
        shows_last_seen = replace(now, last_seen_visibility=Visibility.EVERYONE)
        assert change.seen_by(VIEWER, shows_last_seen, stranger, long_offline)
        assert not change.seen_by(VIEWER, shows_last_seen, hides_own, long_offline)
        # Online, or offline so lately that a view may still show it online: told.
        for live in (ONLINE, JUST_OFFLINE):
            ended = domain.ended_of(live, now, SETTLED, TIMING)
            assert change.seen_by(VIEWER, now, stranger, ended)
        assert change.seen_by(VIEWER, now, stranger)  # nothing known to have ended
        # A turn online or offline among the kinds (a stamp's span): it was online meanwhile.
        assert change.merged(domain.LIVE_CHANGE).seen_by(VIEWER, now, stranger, long_offline)


def test_a_narrower_activity_level_is_told_only_while_a_custom_status_may_be_shown() -> None:
    """A custom status that ended (its row kept until presence_cleanup) is shown to no one: a
    stranger losing the right to see it sees nothing less, and is not told."""
    stranger = Relation()
    after = Choices(activity_visibility=Visibility.CONTACTS, text="at lunch", expires_at=NOW - 3600)
    change = domain.levels_change(replace(after, activity_visibility=Visibility.EVERYONE), after)
    ended = domain.ended_of(OFFLINE, after, SETTLED, TIMING)
    assert ended.custom_status
    assert not change.seen_by(VIEWER, after, stranger, ended)
    # Ended so lately that a view may still show it, or not ended: told.
    for expires_at in (NOW - 10, NOW + 60, None):
        live = replace(after, expires_at=expires_at)
        assert change.seen_by(
            VIEWER, live, stranger, domain.ended_of(OFFLINE, live, SETTLED, TIMING)
        )
    # A change of the custom status among the kinds (its end, announced in a stamp's span):
    # a view before it showed it.
    assert change.merged(domain.ACTIVITY_CHANGE).seen_by(VIEWER, after, stranger, ended)


def test_a_save_hiding_the_online_status_both_ways_is_told() -> None:
    """One save that narrows the online level and turns invisible: a stranger who saw the user
    online sees them offline (neither alone says so, judged with the levels after it)."""
    before = Choices(online_visibility=Visibility.EVERYONE)
    after = replace(before, online_visibility=Visibility.CONTACTS, invisible=True)
    change = domain.levels_change(before, after)
    assert resolved(ONLINE, before, Relation()).is_online
    assert change.seen_by(
        VIEWER, after, Relation(), domain.ended_of(ONLINE, after, SETTLED, TIMING)
    )


@pytest.mark.parametrize("relation", list(relations()))
def test_a_change_of_relation_with_someone_else_is_nobody_else_s(relation: Relation) -> None:
    for block in (False, True):
        change = domain.relation_change([VIEWER + 1], block)
        assert not change.seen_by(VIEWER, Choices(), relation)
    # With the viewer: theirs, but across a block (as it stands after it) only the block's.
    assert domain.relation_change([VIEWER], block=True).seen_by(VIEWER, Choices(), relation)
    seen = domain.relation_change([VIEWER]).seen_by(VIEWER, Choices(), relation)
    assert seen is not relation.blocked


def test_a_block_hides_every_change_but_one_of_the_block_itself() -> None:
    """Across a block nothing is told, not even that the other changed something about the
    viewer (unfollowed them, made an exception for them): only a block made or lifted between
    them changes what they see of each other."""
    blocked = Relation(is_contact=True, blocked=True)
    everyone = Choices(
        online_visibility=Visibility.EVERYONE,
        last_seen_visibility=Visibility.EVERYONE,
        activity_visibility=Visibility.EVERYONE,
    )
    kinds_of_change = (Kind.LIVE, Kind.ACTIVITY, Kind.INVISIBLE, Kind.RULES, Kind.RELATION)
    for kinds in kinds_of_change:
        assert not Change(kinds, frozenset({VIEWER + 1})).seen_by(VIEWER, everyone, blocked)
        assert not Change(kinds, frozenset({VIEWER})).seen_by(VIEWER, everyone, blocked)
    assert not domain.relation_change([VIEWER]).seen_by(VIEWER, everyone, blocked)
    assert domain.relation_change([VIEWER], block=True).seen_by(VIEWER, everyone, blocked)
    assert not domain.relation_change([VIEWER + 1], block=True).seen_by(VIEWER, everyone, blocked)


def test_a_close_friend_sees_more_only_where_a_level_is_for_close_friends() -> None:
    for levels in choices():
        for_close_friends = [
            setting
            for setting in ("online_visibility", "last_seen_visibility", "activity_visibility")
            if getattr(levels, setting) is Visibility.CLOSE_FRIENDS
        ]
        assert domain.close_friend_shows_more(levels) is bool(for_close_friends)
        # an exception for a setting beats its level, before and after the marking
        assert not domain.close_friend_shows_more(levels, for_close_friends)


def test_a_level_changed_while_it_alters_nothing_shown_is_no_one_s() -> None:
    """The online level of an invisible user (hidden either way), the activity level of one
    without a custom status: the viewers whose permission it changed see nothing new."""
    stranger = Relation()
    for setting, shown in (("online_visibility", "invisible"), ("activity_visibility", "text")):
        before = Choices(**{setting: Visibility.NOBODY})
        after = replace(before, **{setting: Visibility.EVERYONE})
        hidden = replace(after, invisible=True) if shown == "invisible" else after
        visible = after if shown == "invisible" else replace(after, text="at lunch")
        change = domain.levels_change(before, after)
        assert change.kinds & LEVELS
        assert not change.seen_by(VIEWER, hidden, stranger), setting
        assert change.seen_by(VIEWER, visible, stranger), setting


def test_levels_changed_in_a_way_not_known_and_unknown_changes_are_every_unblocked_viewer_s() -> (
    None
):
    # A row saved without being read: what it said before is not known, so a change of its
    # levels may make anyone but a blocked viewer see more or less. A change of unknown kind
    # (a site's own) is everyone's.
    for relation in relations():
        assert Change(Kind.RULES).seen_by(VIEWER, Choices(), relation) is not relation.blocked
        # Levels that change nothing for anyone (a setting saved as it was) are no one's.
        assert not domain.levels_change(Choices(), Choices()).seen_by(VIEWER, Choices(), relation)
        assert domain.ANY_CHANGE.seen_by(VIEWER, Choices(), relation)


def test_the_user_sees_every_change_of_their_own() -> None:
    for kinds in Kind:
        assert Change(kinds).seen_by(VIEWER, Choices(), domain.SELF)


def test_changes_merge_their_kinds_and_users() -> None:
    merged = domain.LIVE_CHANGE.merged(domain.relation_change([1])).merged(
        domain.relation_change([2])
    )
    assert merged == Change(Kind.LIVE | Kind.RELATION, frozenset({1, 2}))
    changes: dict[int, Change] = {}
    domain.add_change(changes, 1, domain.ACTIVITY_CHANGE)
    domain.add_change(changes, 1, domain.LIVE_CHANGE)
    domain.add_change(changes, 2, domain.LIVE_CHANGE)
    assert changes == {1: Change(Kind.LIVE | Kind.ACTIVITY), 2: domain.LIVE_CHANGE}


# --- a change as announcements carry it (presence.announce) ---------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        domain.LIVE_CHANGE,
        domain.RULES_CHANGE,
        Change(Kind(0)),
        domain.relation_change([3, 4]),
        Change(Kind.ONLINE_FOR_CONTACTS | Kind.ACTIVITY_FOR_CLOSE_FRIENDS),
    ],
)
def test_an_announcement_carries_its_change(change: Change) -> None:
    assert announce.change_of(announce.change_fields(change)) == change


@pytest.mark.parametrize(
    "message",
    [
        {},  # an announcer of an earlier version
        {"kinds": "1"},
        {"kinds": True},
        {"kinds": domain.ALL_KINDS + 1},
        {"kinds": -1},
        {"kinds": 16, "between": [[1]]},
        {"kinds": 16, "between": 5},
    ],
)
def test_an_announcement_whose_change_cannot_be_read_is_everyone_s(message: dict) -> None:
    assert announce.change_of(message) == domain.ANY_CHANGE
