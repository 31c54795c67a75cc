"""Presence's privacy rule for any app: :func:`permits` for one viewer and one owner, and
:func:`visible_to`, the same rule as a queryset filter.

A site app with rows owned by users (posts, photos, "typing…" markers) filters them with
``Model.objects.filter(visible_to(request.user, owner_field="owner"))`` and gets exactly what
``permits`` decides for each row: the owner sees their own, a block in either direction hides,
else the owner's visibility setting (``online_visibility``, ``last_seen_visibility`` or
``activity_visibility`` of ``PrivacySettings``; no row: the site's ``DEFAULT_PRIVACY``, else
``contacts``, as the resolver reads it) against the tie of the owner to the viewer
(``Contact``), the owner's exception for the viewer (``PrivacyException``: "never share"
and "always share" beat the level) deciding first. The filter is derived from ``permits`` and
checked against it at import, so the two can never disagree.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, Q

from presence import domain
from presence.domain import Relation, Visibility, permits
from presence.models import Block, Contact, PrivacyException, privacy_defaults
from presence.users import viewer_pk as _viewer_pk_of

__all__ = ["SETTINGS", "TIES", "permits", "visible_to"]

#: the visibility settings of PrivacySettings that visible_to() can filter by
SETTINGS = domain.VISIBILITY_SETTINGS


def _tie_required(level: Visibility) -> str | None:
    """The weakest tie of the owner to the viewer that ``level`` admits, read off
    :func:`presence.domain.permits` (the one rule): "none", "contact", "close_friend" or None
    (nobody). Checked at import against every relation the database can express."""
    if domain.permits(level, domain.STRANGER):
        return "none"
    if domain.permits(level, Relation(is_contact=True)):
        return "contact"
    if domain.permits(level, Relation(is_contact=True, is_close_friend=True)):
        return "close_friend"
    return None


TIES: dict[Visibility, str | None] = {level: _tie_required(level) for level in Visibility}
_TIE_RANK = {"none": 0, "contact": 1, "close_friend": 2}


def _check_ties() -> None:
    # The SQL filter below assumes the rule is "a block hides; else the tie must reach the
    # level's minimum" for each relation a Contact row can express. Fail loudly if the rule
    # in domain.permits ever stops being that.
    relations_ = {
        "none": Relation(),
        "contact": Relation(is_contact=True),
        "close_friend": Relation(is_contact=True, is_close_friend=True),
    }
    for level, needed in TIES.items():
        for tie, relation in relations_.items():
            expected = needed is not None and _TIE_RANK[tie] >= _TIE_RANK[needed]
            blocked = Relation(
                is_contact=relation.is_contact,
                is_close_friend=relation.is_close_friend,
                blocked=True,
            )
            if domain.permits(level, relation) != expected or domain.permits(level, blocked):
                raise AssertionError(f"presence.privacy cannot express permits({level}, {tie})")
            # An exception beats the level, a block beats an exception.
            for setting in SETTINGS:
                for allow in (True, False):
                    bits = domain.exception_bits(setting, allow)
                    excepted = Relation(
                        is_contact=relation.is_contact,
                        is_close_friend=relation.is_close_friend,
                        exceptions=bits,
                    )
                    blocked_excepted = Relation(blocked=True, exceptions=bits)
                    if domain.permits(level, excepted, setting) != allow or domain.permits(
                        level, blocked_excepted, setting
                    ):
                        raise AssertionError(
                            f"presence.privacy cannot express an exception of {setting}"
                        )


_check_ties()


def visible_to(viewer: Any, owner_field: str = "author", setting: str = "activity_visibility") -> Q:
    """A filter keeping the rows whose owner lets ``viewer`` see them by ``setting``.

    ``viewer`` is a user, an anonymous user or None, or a user id. ``owner_field`` is the
    lookup of the owning user from the filtered model (``"author"``, ``"activity__author"``;
    ``"pk"`` on the user model itself). ``setting`` is one of :data:`SETTINGS`.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {', '.join(SETTINGS)}, got {setting!r}.")
    viewer_pk = _viewer_pk_of(viewer)
    prefix = "" if owner_field == "pk" else f"{owner_field}__"
    level_field = f"{prefix}presence_privacy__{setting}"
    # An owner without a PrivacySettings row has the site's level (DEFAULT_PRIVACY), as the
    # resolver reads it (presence.relations): no join more, the row's absence is tested.
    default = getattr(privacy_defaults(), setting)
    them = OuterRef(owner_field)

    def level_is(level: Visibility) -> Q:
        q = Q(**{level_field: level.value})
        if level is default:
            q |= Q(**{f"{prefix}presence_privacy__isnull": True})
        return q

    ties: dict[str, Any] = {"none": None}
    if viewer_pk is not None:
        ties["contact"] = Exists(Contact.objects.filter(owner=them, contact=viewer_pk))
        ties["close_friend"] = Exists(
            Contact.objects.filter(owner=them, contact=viewer_pk, close_friend=True)
        )
    admitted = Q(pk__in=[])  # nothing, until a level admits
    for level, needed in TIES.items():
        if needed is None or needed not in ties:
            continue
        tie = ties[needed]
        admitted |= level_is(level) if tie is None else level_is(level) & tie
    if viewer_pk is None:
        return admitted
    not_blocked = ~Exists(Block.objects.filter(blocker=them, blocked=viewer_pk)) & ~Exists(
        Block.objects.filter(blocker=viewer_pk, blocked=them)
    )
    exceptions = PrivacyException.objects.filter(owner=them, viewer=viewer_pk, setting=setting)
    decided = ~Exists(exceptions.filter(allow=False)) & (
        Exists(exceptions.filter(allow=True)) | admitted
    )
    return Q(**{owner_field: viewer_pk}) | (not_blocked & decided)
