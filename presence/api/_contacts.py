"""Contacts and blocks (a site's own graph), and notifying after writes the signals miss.

Each write is one database call, announced by the model's receivers after commit
(presence.receivers); its async twin runs that call through :func:`presence.operations.arun`:
in the database's thread, its announcement sent from the caller's event loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from presence import announce
from presence.api._reading import _target_ids
from presence.domain import InvalidInput
from presence.models import Block, Contact
from presence.operations import arun, call
from presence.users import user_pk as _pk


def _two_users(first: Any, second: Any, action: str) -> tuple[Any, Any]:
    first_pk, second_pk = _pk(first), _pk(second)
    if first_pk == second_pk:
        raise InvalidInput("invalid_value", f"A user cannot {action} themselves.")
    found = get_user_model()._default_manager.filter(pk__in=[first_pk, second_pk]).count()
    if found != 2:
        raise InvalidInput("unknown_users", f"No user has the id {first_pk} or {second_pk}.")
    return first_pk, second_pk


def follow(owner: Any, target: Any) -> bool:
    """``owner`` adds ``target`` to its contacts (follows it). True if that changed anything.

    Saves the row like the admin does, so open connections see the change after commit. With
    the default ``contacts`` visibility, ``target`` now sees ``owner`` online; two users who
    follow each other are friends (``online_friends``)."""
    owner_pk, target_pk = _two_users(owner, target, "follow")
    _, created = Contact.objects.get_or_create(owner_id=owner_pk, contact_id=target_pk)
    return created


def unfollow(owner: Any, target: Any) -> bool:
    """``owner`` removes ``target`` from its contacts (and close friends). True if it was one."""
    owner_pk, target_pk = _pk(owner), _pk(target)
    # A queryset delete sends post_delete for each row (presence listens to it).
    deleted, _ = Contact.objects.filter(owner_id=owner_pk, contact_id=target_pk).delete()
    return deleted > 0


def set_close_friend(owner: Any, target: Any, close_friend: bool = True) -> bool:
    """Mark (or unmark) ``target`` as one of ``owner``'s close friends, following it if needed.
    True if that changed anything."""
    owner_pk, target_pk = _two_users(owner, target, "befriend")
    contact, created = Contact.objects.get_or_create(
        owner_id=owner_pk, contact_id=target_pk, defaults={"close_friend": close_friend}
    )
    if created or contact.close_friend == close_friend:
        return created
    contact.close_friend = close_friend
    contact.save(update_fields=["close_friend"])
    return True


def block(blocker: Any, blocked: Any) -> bool:
    """``blocker`` blocks ``blocked``: each is hidden from the other (offline, no last seen, no
    custom status, no diffs). True if it was not blocked yet."""
    blocker_pk, blocked_pk = _two_users(blocker, blocked, "block")
    _, created = Block.objects.get_or_create(blocker_id=blocker_pk, blocked_id=blocked_pk)
    return created


def unblock(blocker: Any, blocked: Any) -> bool:
    """Lift ``blocker``'s block of ``blocked``. True if there was one."""
    deleted, _ = Block.objects.filter(blocker_id=_pk(blocker), blocked_id=_pk(blocked)).delete()
    return deleted > 0


async def afollow(owner: Any, target: Any) -> bool:
    return await arun(call(follow, owner, target))


async def aunfollow(owner: Any, target: Any) -> bool:
    return await arun(call(unfollow, owner, target))


async def aset_close_friend(owner: Any, target: Any, close_friend: bool = True) -> bool:
    return await arun(call(set_close_friend, owner, target, close_friend))


async def ablock(blocker: Any, blocked: Any) -> bool:
    return await arun(call(block, blocker, blocked))


async def aunblock(blocker: Any, blocked: Any) -> bool:
    return await arun(call(unblock, blocker, blocked))


def notify_changed(users: Iterable[Any], reason: str = "bulk") -> None:
    """Tell open connections that what others may see of ``users`` may have changed.

    Presence hears about changes to its models through ``post_save``/``post_delete``; a
    ``QuerySet.update()``, ``bulk_create``/``bulk_update``, a queryset ``delete()`` of rows
    without signals, or raw SQL sends none, so a site calls this after such a write (of
    PrivacySettings, Contact, Block or UserStatus rows). ``users`` are users or ids: every user
    whose presence others see differently (for a Contact, its owner; for a Block, both users).
    After the current transaction commits (right away outside one), pushes diffs to open
    WebSockets and sends :data:`presence.signals.presence_changed` with ``reason`` for each.
    """
    user_ids = _target_ids(users)
    if user_ids:
        transaction.on_commit(lambda: announce.changed(user_ids, reason))


async def anotify_changed(users: Iterable[Any], reason: str = "bulk") -> None:
    await arun(call(notify_changed, list(users), reason))
