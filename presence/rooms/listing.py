"""The one listing rule of a room, for a viewer: which members read it lists, in which order,
and how many it counts. No I/O.

A single read (presence.rooms.reading) and a batch of joins (presence.rooms.joins) both apply
it; they differ only in how they come by each member's facts and presence as the viewer sees
it (the one resolver's): the read resolves its candidates once for its viewer, the batch once
per (member, relation) for all its joiners.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from presence.domain import Choices, Presence, Relation, UserId
from presence.domain.rooms import (
    Candidate,
    Member,
    Room,
    RoomState,
    is_counted,
    is_listed,
    order_listed,
)

if TYPE_CHECKING:
    from presence.store.plans.rooms import MemberEntry

#: a listed member's place (:func:`rank`)
Rank = tuple[bool, float, str]


def rank(contact: bool, joined_at: float, user_id: UserId) -> Rank:
    """A listed member's place after the viewer (order_listed): contacts first, then by join
    time, then by id as text; the smaller the earlier."""
    return (not contact, joined_at, str(user_id))


def listable(
    members: Mapping[UserId, MemberEntry],
    excluded: set[UserId],
    contacts: set[UserId],
    facts_of: Callable[[UserId], tuple[Relation, Choices] | None],
    presence_of: Callable[[UserId, Relation], Presence],
) -> list[tuple[Candidate, Member]]:
    """The members the viewer may list, with what it is shown of each: of ``members`` but
    ``excluded`` (invisible by the room's flags, a block between them), those whose presence
    as the viewer sees it lists them; those the viewer may not count (a block since joining)
    are added to ``excluded``; a member without facts (a user deleted since joining) is
    counted, never listed.

    Whether a member counts follows the room's invisible flag alone, as every count does
    (room_counts, a live view's diffs): one who went invisible since their connections last
    wrote it (none left to write it: closed within OFFLINE_GRACE, crashed) resolves offline,
    so is not listed, but is counted until the flag is written or their stay ends."""
    found = []
    for uid, entry in members.items():
        if uid in excluded:
            continue
        facts = facts_of(uid)
        if facts is None:
            continue
        relation, _ = facts
        if not is_counted(relation, invisible=False):
            excluded.add(uid)
            continue
        presence = presence_of(uid, relation)
        if is_listed(relation, presence):
            candidate = Candidate(uid, entry.joined_at, uid in contacts, is_self=relation.is_self)
            found.append((candidate, Member(entry.meta, presence)))
    return found


def listed_state(
    room: Room,
    found: list[tuple[Candidate, Member]],
    limit: int,
    present: int,
    excluded: set[UserId],
) -> RoomState:
    """The room as the viewer sees it: the first ``limit`` of ``found`` (:func:`listable`) in
    the listing order, with their places; the others counted (the ``present`` members but the
    ``excluded``)."""
    by_id = {candidate.user_id: (candidate, member) for candidate, member in found}
    members: dict[UserId, Member] = {}
    ranks: dict[UserId, Rank] = {}
    for uid in order_listed([candidate for candidate, _ in found], limit):
        candidate, members[uid] = by_id[uid]
        ranks[uid] = rank(candidate.contact, candidate.joined_at, uid)
    count = max(present - len(excluded), len(members))
    return RoomState(room, members, count - len(members), ranks)
