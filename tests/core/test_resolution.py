"""The resolver applied to many targets at once (presence.resolution.resolve_each): each
distinct (live state, choices, relation) is resolved once, and every target is still shown
exactly what the one resolver shows it alone."""

from __future__ import annotations

from collections.abc import Iterator

from presence import domain, resolution
from presence.domain import Choices, Device, LiveState, Relation, UserId, Visibility
from tests.core.domain_cases import BLOCKED_CONTACT, CONTACT, NOW, STRANGER

ACTIVE = LiveState(last_active=NOW - 10, devices=(Device.WEB,))
GONE = LiveState(last_active=NOW - 3 * 86_400, devices=(Device.WEB,))
#: online status to everyone, last seen and activity to contacts (a room's usual member)
SHOWN = Choices(
    online_visibility=Visibility.EVERYONE,
    last_seen_visibility=Visibility.CONTACTS,
    activity_visibility=Visibility.CONTACTS,
    text="lunch",
)


def alone(live: LiveState, choices: Choices, relation: Relation) -> domain.Presence:
    return domain.resolve(live, choices, relation, NOW, resolution.timing())


def test_targets_sharing_their_facts_are_resolved_once() -> None:
    facts = {n: (STRANGER, SHOWN) for n in range(1, 6)}
    got = resolution.resolve_all(facts, {n: ACTIVE for n in facts}, NOW)
    assert got[1] == alone(ACTIVE, SHOWN, STRANGER)
    # one Presence for the five (resolving it again for each cost a room's read per member)
    assert len({id(presence) for presence in got.values()}) == 1


def test_each_target_is_shown_what_the_resolver_shows_it_alone() -> None:
    # The same live state and choices objects, other relations; the same relation and
    # choices, another live state; a blocked one among them.
    cases: dict[UserId, tuple[LiveState, Choices, Relation]] = {
        1: (ACTIVE, SHOWN, STRANGER),
        2: (ACTIVE, SHOWN, CONTACT),
        3: (ACTIVE, SHOWN, BLOCKED_CONTACT),
        4: (GONE, SHOWN, STRANGER),
        5: (ACTIVE, SHOWN, STRANGER),
    }
    got = resolution.resolve_all(
        {uid: (relation, choices) for uid, (_, choices, relation) in cases.items()},
        {uid: live for uid, (live, _, _) in cases.items()},
        NOW,
    )
    assert got == {uid: alone(*case) for uid, case in cases.items()}
    assert got[2].text == "lunch" and got[1].text is None  # activity to contacts only
    assert got[3] == domain.HIDDEN
    assert got[4].status is domain.Status.OFFLINE


def test_facts_dropped_once_resolved_never_answer_for_others() -> None:
    """Facts given one at a time, each dropped by its giver once resolved: a new object may
    take a dropped one's place in memory, and must not be taken for it."""

    def each() -> Iterator[tuple[UserId, tuple[Relation, Choices]]]:
        for n in range(200):
            # a fresh object each time, invisible one time in three
            invisible = n % 3 == 1
            yield n, (STRANGER, Choices(online_visibility=Visibility.EVERYONE, invisible=invisible))

    got = resolution.resolve_each(each(), {n: ACTIVE for n in range(200)}, NOW)
    assert [presence.is_online for presence in got.values()] == [n % 3 != 1 for n in range(200)]
