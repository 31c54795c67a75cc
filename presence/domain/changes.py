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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from presence.domain.model import (
    EXCEPTION_ALLOW,
    EXCEPTION_DENY,
    EXCEPTION_SHIFT,
    VISIBILITY_SETTINGS,
    Choices,
    LiveState,
    Relation,
    Timing,
    UserId,
    Visibility,
)
from presence.domain.resolver import offline_at, permits


class Kind(enum.IntFlag):
    """What changed. Each decides who can see it (:meth:`Change.seen_by`)."""

    #: online, idle, offline, devices, last seen, do not disturb: seen by whoever may see online
    LIVE = 1
    #: the custom status (text, emoji, activity, its end): seen by whoever may see activity
    ACTIVITY = 2
    #: invisible turned on or off: seen by whoever may see online but for it, where that hides
    #: or shows something (the user online, or the exact last seen)
    INVISIBLE = 4
    #: the privacy levels, changed in a way not known (a change its process may have died
    #: before announcing): may change what any viewer but a blocked one sees
    RULES = 8
    #: the relation with the users named (a contact, an exception, a block): theirs alone
    RELATION = 16
    #: not known (a site's own ``presence_changed``, a deleted user): everyone's
    UNKNOWN = 32
    #: a privacy level changed whether one class of viewers (without an exception for that
    #: setting) may see that setting: strangers, contacts, close friends (levels_change)
    ONLINE_FOR_STRANGERS = 64
    ONLINE_FOR_CONTACTS = 128
    ONLINE_FOR_CLOSE_FRIENDS = 256
    LAST_SEEN_FOR_STRANGERS = 512
    LAST_SEEN_FOR_CONTACTS = 1024
    LAST_SEEN_FOR_CLOSE_FRIENDS = 2048
    ACTIVITY_FOR_STRANGERS = 4096
    ACTIVITY_FOR_CONTACTS = 8192
    ACTIVITY_FOR_CLOSE_FRIENDS = 16384
    #: a block between the user and the users named (RELATION's) was made or lifted: the one
    #: relation change a viewer blocked either way before or after it can see
    BLOCK = 32768


#: every kind's bits (a message or a stamp of more is not one of this version's)
ALL_KINDS = sum(kind.value for kind in Kind)
#: the kinds that say a privacy level changed for some class of viewers
LEVELS = Kind(
    sum(
        kind.value
        for kind in Kind
        if Kind.ONLINE_FOR_STRANGERS <= kind.value <= Kind.ACTIVITY_FOR_CLOSE_FRIENDS
    )
)

#: the kinds that may alter what a viewer of no relation changed sees (Change.seen_by)
_SHAPING = Kind.LIVE | Kind.ACTIVITY | Kind.INVISIBLE | LEVELS

#: the classes of viewers a privacy level tells apart, each with one relation of its class
_CLASSES = (
    Relation(),
    Relation(is_contact=True),
    Relation(is_contact=True, is_close_friend=True),
)


def _level_kind(setting: str, viewers: int) -> Kind:
    """The kind "``setting``'s permission changed for class ``viewers`` (0, 1, 2)"."""
    return Kind(Kind.ONLINE_FOR_STRANGERS << (3 * VISIBILITY_SETTINGS.index(setting) + viewers))


def _class_of(relation: Relation) -> int:
    if relation.is_contact:
        return 2 if relation.is_close_friend else 1
    return 0


def levels_change(before: Choices, after: Choices) -> Change:
    """The change of a user's privacy settings from ``before`` to ``after``: for each setting
    and class of viewers, whether that class's permission changed (a viewer with an exception
    for the setting keeps theirs), and whether invisible was turned on or off."""
    kinds = Kind(0)
    for setting in VISIBILITY_SETTINGS:
        old, new = getattr(before, setting), getattr(after, setting)
        if old is new:
            continue
        for viewers, relation in enumerate(_CLASSES):
            if permits(Visibility(old), relation) != permits(Visibility(new), relation):
                kinds |= _level_kind(setting, viewers)
    if before.invisible != after.invisible:
        kinds |= Kind.INVISIBLE
    return Change(kinds)


#: a UserStatus row's fields that shape what viewers see, and their values without a row
STATUS_FIELDS = ("dnd", "text", "emoji", "activity", "expires_at")
NO_STATUS: dict[str, Any] = {
    "dnd": False,
    "text": "",
    "emoji": "",
    "activity": "",
    "expires_at": None,
}


def status_change(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> Change:
    """The change of a user's status row from ``before`` to ``after`` (None: no row): do not
    disturb is the live state's; text, emoji, activity and their expiry are the custom
    status's (seen by those who may see activity)."""
    old, new = before or NO_STATUS, after or NO_STATUS
    kinds = Kind(0)
    if old["dnd"] != new["dnd"]:
        kinds |= Kind.LIVE
    if any(old[name] != new[name] for name in STATUS_FIELDS[1:]):
        kinds |= Kind.ACTIVITY
    return Change(kinds)


def close_friend_shows_more(levels: Choices, excepted: Iterable[str] = ()) -> bool:
    """Whether a contact marked (or unmarked) a close friend sees more (or less) under these
    levels: some setting, but those ``excepted`` (the contact has an exception for them,
    which beats the level), shows close friends what it does not show contacts."""
    skip = set(excepted)
    contact, close = _CLASSES[1], _CLASSES[2]
    return any(
        permits(getattr(levels, setting), contact) != permits(getattr(levels, setting), close)
        for setting in VISIBILITY_SETTINGS
        if setting not in skip
    )


#: how long after an end fell due (a turn offline, a custom status's end) a view may not have
#: been told of it yet: the sweep that announces it runs every SWEEP_INTERVAL, a dead sweeper's
#: claim lapses after LIVE_SOCKET_TIMEOUT, a storm's users take a few sweeps (a floor:
#: presence.lifecycle raises it for slower settings)
END_NEWS_LAG = 60.0


@dataclass(frozen=True, slots=True)
class Ended:
    """What of a user's presence no view a change may alter shows any longer: what ended
    before the views were resolved, or long enough before the change (:data:`END_NEWS_LAG`)
    that each view it altered was told of it then. A change that would hide it (going
    invisible, a narrower level) shows such a view nothing."""

    #: the user is offline since then (or never was online)
    offline: bool = False
    #: the custom status of the user's choices ended by then
    custom_status: bool = False


#: nothing known to be over (the live state not read): a change is judged as if a view might
#: still show the user online and their custom status
NOTHING_ENDED = Ended()


def ended_of(live: LiveState | None, choices: Choices, settled: float, timing: Timing) -> Ended:
    """What of a user's presence (``live``: their live state, None if not known; ``choices``:
    their choices) ended by ``settled``: a time by which every view a change may alter shows
    its ends. A resolver hides an end at once, but a view resolved before it shows what it
    ended until the sweep announces it: a change judged meanwhile must not leave that view
    behind (a stamp's time, less the clocks' slack; else the time of the judging less
    :data:`END_NEWS_LAG`)."""
    offline = False
    if live is not None:
        deadline = offline_at(live, timing)
        offline = deadline is None or deadline <= settled
    expires_at = choices.expires_at
    return Ended(offline=offline, custom_status=expires_at is not None and expires_at <= settled)


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

    def seen_by(
        self,
        viewer: UserId | None,
        choices: Choices,
        relation: Relation,
        ended: Ended = NOTHING_ENDED,
    ) -> bool:
        """Whether this change can alter what ``viewer`` (of ``relation`` to the user, whose
        ``choices`` are the ones after it) sees; ``ended``: what of the user's presence no view
        shows any longer (:func:`ended_of`). False only where the view before and after is
        provably the same: then the viewer is not told, and learns nothing of it.

        The change may be several merged (a coalesced delivery, a stamp's span): the choices
        before are any its kinds leave possible, each permission of the viewer's class that
        the levels changed and the invisibility, if it changed, either way."""
        kinds = self.kinds
        if kinds & Kind.UNKNOWN or relation.is_self:
            return True
        if relation.blocked:
            # A block hides everything, whatever the levels, status, state or any other
            # relation change between them: only the block made (or one of two lifted) is news.
            return bool(kinds & Kind.BLOCK) and viewer in self.between
        if kinds & Kind.RELATION and viewer in self.between:
            return True
        if kinds & Kind.RULES:
            return True
        if not kinds & _SHAPING:
            return False  # a relation with someone else: nothing of this viewer's
        online = self._permissions(choices, relation, "online_visibility")
        activity = self._permissions(choices, relation, "activity_visibility")
        invisible = (False, True) if kinds & Kind.INVISIBLE else (choices.invisible,)
        shows_online = {may and not hidden for may in online for hidden in invisible}
        if kinds & Kind.LIVE and True in shows_online:
            return True
        if kinds & Kind.ACTIVITY and True in activity:
            return True
        # Below, the user's state and custom status are as they were: only what the viewer may
        # see of them changed. A set of two: some view before differs from the view after.
        if len(shows_online) > 1 and not ended.offline:
            # The online status, of a user who may be (or still be shown) online: an offline
            # user's is "offline" either way.
            return True
        custom_status = choices.text or choices.emoji or choices.activity
        if len(activity) > 1 and custom_status and not ended.custom_status:
            return True
        if relation.hides_own_last_seen:
            return False  # the approximate last seen only, either way (it ignores both)
        last_seen = self._permissions(choices, relation, "last_seen_visibility")
        # The exact last seen needs the online status shown too; hidden, the approximate one
        # is shown instead, the same whatever hid it.
        exact = {shown and may for shown in shows_online for may in last_seen}
        return len(exact) > 1

    def _permissions(self, choices: Choices, relation: Relation, setting: str) -> tuple[bool, ...]:
        """Whether ``relation``'s viewer may see ``setting``: after this change, and before it
        if the change may have turned that permission (its class's, without an exception for
        the setting, which beats the level before and after)."""
        after = permits(getattr(choices, setting), relation, setting)
        if not self.kinds & _level_kind(setting, _class_of(relation)):
            return (after,)
        if relation.exceptions >> EXCEPTION_SHIFT[setting] & (EXCEPTION_ALLOW | EXCEPTION_DENY):
            return (after,)
        return (after, not after)


#: a change of unknown kind: everyone who may see the user is told
ANY_CHANGE = Change(Kind.UNKNOWN)
LIVE_CHANGE = Change(Kind.LIVE)
ACTIVITY_CHANGE = Change(Kind.ACTIVITY)
RULES_CHANGE = Change(Kind.RULES | Kind.INVISIBLE)


def relation_change(others: Iterable[UserId], block: bool = False) -> Change:
    """The relation of a user with ``others`` changed (and nobody else's view of them);
    ``block``: a block between them was made or lifted."""
    return Change(Kind.RELATION | Kind.BLOCK if block else Kind.RELATION, frozenset(others))


def add_change(changes: dict[UserId, Change], user_id: UserId, change: Change) -> None:
    """``change`` of ``user_id`` added to ``changes`` (merged with the one there)."""
    known = changes.get(user_id)
    changes[user_id] = change if known is None else known.merged(change)
