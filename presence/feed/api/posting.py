"""Posting with ``@mentions``: an activity and the users it mentions, saved in one transaction,
and :data:`activity_posted` sent after commit. An activity's mentions (with their users) are kept
on it once loaded (:func:`mentions_of`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.db import router, transaction
from django.db.models import Q
from django.dispatch import Signal

from presence.feed import domain as feed_domain
from presence.feed.conf import get_settings
from presence.feed.models import Activity, ActivityKind, Mention
from presence.models import Block
from presence.users import viewer_pk as _viewer_pk_of

#: Sent after commit when an activity was posted: ``activity`` (an Activity, author loaded).
#: Listeners decide per viewer with :func:`~presence.feed.api.can_see` (or filter with
#: :func:`~presence.feed.api.visible_to`).
activity_posted = Signal()

#: most distinct names looked up for mentions in one post
MAX_MENTION_NAMES = 100
#: where a posted activity, or a page, keeps each activity's mentions (with their users), read
#: by mentions_of()
_MENTIONS_ATTR = "_presence_mentions"


def _author_pk(author: Any) -> Any:
    pk = _viewer_pk_of(author)
    if pk is None:
        raise TypeError(f"Expected a saved, authenticated user or a user id, got {author!r}.")
    return pk


def handle_field() -> str:
    """The user model's field of public handles (``HANDLE_FIELD``, else USERNAME_FIELD)."""
    return get_settings().HANDLE_FIELD or get_user_model().USERNAME_FIELD


def handle_of(user: Any) -> str | None:
    """``user``'s public handle, or None where it must not be shown: empty, or an e-mail
    address (a site logging in by e-mail names a public field with HANDLE_FIELD)."""
    value = getattr(user, handle_field(), None)
    if not value or "@" in str(value):
        return None
    return str(value)


def _known_users(names: Sequence[str]) -> list[Any]:
    """Users named (exactly, or ignoring case) by ``names``, each once. One query for the exact
    names (the unique index); a second one only for names no handle spells exactly: ASCII names
    with ``iexact``, others with a pattern of each letter's cases (SQLite ignores the case of
    ASCII letters only; feed_domain.handle_lookup folds the rows found alike everywhere)."""
    if not names:
        return []
    field = handle_field()
    manager = get_user_model()._default_manager
    found = {user.pk: user for user in manager.filter(**{f"{field}__in": names})}
    spelt = {getattr(user, field) for user in found.values()}
    others = [name for name in names if name not in spelt]
    if others:
        folded = Q()
        for name in others:
            if name.isascii():
                folded |= Q(**{f"{field}__iexact": name})
            else:
                folded |= Q(**{f"{field}__regex": feed_domain.any_case_pattern(name)})
        for user in manager.filter(folded):
            found.setdefault(user.pk, user)
    return list(found.values())


def _resolve(text: str) -> list[feed_domain.MentionSpan[Any]]:
    """Where ``text`` mentions whom (see docs/feed.md, "Mentions")."""
    names = feed_domain.candidate_names(text)[:MAX_MENTION_NAMES]
    pairs = [(handle, user) for user in _known_users(names) if (handle := handle_of(user))]
    return feed_domain.resolve_mentions(text, feed_domain.handle_lookup(pairs))


def mentioned_users(text: str) -> list[Any]:
    """The users ``text`` mentions, in text order, each once (see docs/feed.md)."""
    return feed_domain.unique_targets(_resolve(text), key=lambda user: user.pk)


def _not_blocked(author_pk: int, users: list[Any]) -> list[Any]:
    """``users`` without those blocked by, or blocking, the author: a mention across a block is
    not stored at all (it would reach the blocked user's mentions again after an unblock)."""
    ids = [user.pk for user in users]
    if not ids:
        return users
    pairs = Block.objects.filter(
        Q(blocker=author_pk, blocked__in=ids) | Q(blocker__in=ids, blocked=author_pk)
    ).values_list("blocker", "blocked")
    blocked = {other for pair in pairs for other in pair if other != author_pk}
    return [user for user in users if user.pk not in blocked]


def post(author: Any, text: Any, *, kind: str = ActivityKind.POST) -> Activity:
    """Post ``text`` as ``author`` and record its ``@mentions``, all in one transaction.

    Users blocked by the author, or blocking the author, are not recorded as mentioned (their
    name stays plain text).

    Raises :class:`InvalidInput` (``invalid_message``: not a string; ``invalid_value``: empty,
    longer than ``ACTIVITY_MAX_LENGTH``, control characters); nothing is saved then. Sends
    :data:`activity_posted` after commit.
    """
    author_pk = _author_pk(author)
    text = feed_domain.clean_text(text, get_settings().ACTIVITY_MAX_LENGTH)
    alias = router.db_for_write(Activity)
    with transaction.atomic(using=alias):
        spans = _resolve(text)
        users = _not_blocked(author_pk, feed_domain.unique_targets(spans, key=lambda u: u.pk))
        activity = Activity(author_id=author_pk, text=text, kind=ActivityKind(kind))
        if not isinstance(author, int | str | UUID):
            activity.author = author
        activity.save(using=alias)
        # Each mention keeps where the text names its user: rendering links exactly these,
        # whoever signs up, changes a handle or is blocked later.
        places: dict[Any, list[list[int]]] = {}
        for span in spans:
            places.setdefault(span.target.pk, []).append([span.start, span.end])
        mentions = [
            Mention(
                activity=activity,
                user=user,
                created_at=activity.created_at,
                spans=places[user.pk],
            )
            for user in users
        ]
        Mention.objects.using(alias).bulk_create(mentions)
        # What rendering needs, so listeners and callers do not query again.
        setattr(activity, _MENTIONS_ATTR, mentions)
        transaction.on_commit(
            lambda: activity_posted.send(sender=Activity, activity=activity), using=alias
        )
    return activity


def _load_mentions(activities: list[Activity]) -> None:
    """Every mention (with its user) of ``activities`` in one query, kept on each activity
    (a plain list: cheaper than prefetch_related's queryset per activity)."""
    found: dict[int, list[Mention]] = {activity.pk: [] for activity in activities}
    # In the order they were recorded (the text's order), whatever the database's own.
    rows = Mention.objects.filter(activity__in=list(found)).select_related("user").order_by("pk")
    for mention in rows:
        found[mention.activity_id].append(mention)
    for activity in activities:
        setattr(activity, _MENTIONS_ATTR, found[activity.pk])


def mentions_of(activity: Activity) -> list[Mention]:
    """The activity's mentions with their users: loaded with the page (no query), or read."""
    loaded = getattr(activity, _MENTIONS_ATTR, None)
    if loaded is None:
        loaded = list(activity.mentions.select_related("user").order_by("pk"))
        setattr(activity, _MENTIONS_ATTR, loaded)
    return list(loaded)
