"""What kind of change a user made, and which viewers it can show anything to.

A change is announced (and stamped) with its kinds, so that a viewer whose view of the user it
cannot alter is not told of it at all: a blocked or non-permitted viewer must not learn that a
user came online, changed a status or a setting, even by being sent the same nothing again. The
live fan-out asks this for a connection whose last view of the user the server does not hold
(a page's dots, left out of a stamped snapshot as unchanged); a resume asks it for each user
changed since its stamp (docs/websocket.md, "Stamps").
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from presence.domain.model import Choices, Relation, UserId
from presence.domain.resolver import permits


class Kind(enum.IntFlag):
    """What changed. Each decides who can see it (:meth:`Change.seen_by`)."""

    #: online, idle, offline, devices, last seen, do not disturb: seen by whoever may see online
    LIVE = 1
    #: the custom status (text, emoji, activity, its end): seen by whoever may see activity
    ACTIVITY = 2
    #: invisible turned on or off: seen by whoever may see online but for it
    INVISIBLE = 4
    #: the privacy levels: may change what any viewer but a blocked one sees
    RULES = 8
    #: the relation with the users named (a contact, an exception, a block): theirs alone
    RELATION = 16
    #: not known (a site's own ``presence_changed``, a deleted user): everyone's
    UNKNOWN = 32


@dataclass(frozen=True)
class Change:
    """A change of a user's presence: its kinds and, for RELATION, the other users of it."""

    kinds: Kind
    #: the users whose relation with the changed user changed (RELATION)
    between: frozenset[UserId] = frozenset()

    def merged(self, other: Change) -> Change:
        """Both changes (coalesced into one delivery)."""
        if other is self:
            return self
        return Change(self.kinds | other.kinds, self.between | other.between)

    def seen_by(self, viewer: UserId | None, choices: Choices, relation: Relation) -> bool:
        """Whether this change can alter what ``viewer`` (of ``relation`` to the user, whose
        ``choices`` are the ones after it) sees. False only where the view before and after
        is provably the same: then the viewer is not told, and learns nothing of it."""
        kinds = self.kinds
        if kinds & Kind.UNKNOWN or relation.is_self:
            return True
        if kinds & Kind.RELATION and viewer in self.between:
            return True
        if relation.blocked:
            return False  # a block hides everything, whatever the levels, status or state
        if kinds & Kind.RULES:
            return True
        may_see_online = permits(choices.online_visibility, relation, "online_visibility")
        if kinds & Kind.INVISIBLE and may_see_online:
            return True
        if kinds & Kind.LIVE and may_see_online and not choices.invisible:
            return True
        return bool(
            kinds & Kind.ACTIVITY
            and permits(choices.activity_visibility, relation, "activity_visibility")
        )


#: a change of unknown kind: everyone who may see the user is told
ANY_CHANGE = Change(Kind.UNKNOWN)
LIVE_CHANGE = Change(Kind.LIVE)
ACTIVITY_CHANGE = Change(Kind.ACTIVITY)
RULES_CHANGE = Change(Kind.RULES | Kind.INVISIBLE)


def relation_change(others: Iterable[UserId]) -> Change:
    """The relation of a user with ``others`` changed (and nobody else's view of them)."""
    return Change(Kind.RELATION, frozenset(others))


def add_change(changes: dict[UserId, Change], user_id: UserId, change: Change) -> None:
    """``change`` of ``user_id`` added to ``changes`` (merged with the one there)."""
    known = changes.get(user_id)
    changes[user_id] = change if known is None else known.merged(change)
