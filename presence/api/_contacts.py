"""Contacts and blocks (a site's own graph), and notifying after writes the signals miss.

Each write is an operation of one database call, announced after commit by the receivers of
its rows (presence.receivers), run as the others are (:mod:`presence.operations`): ``run`` in
the caller's thread, ``arun`` in the database's thread with the announcement sent from the
caller's event loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from presence import announce
from presence.api._reading import _target_ids
from presence.domain import InvalidInput
from presence.models import Block, Contact
from presence.operations import arun, call, run
from presence.users import user_pk as _pk


def _two_users(first: Any, second: Any, action: str) -> tuple[Any, Any]:
    first_pk, second_pk = _pk(first), _pk(second)
    if first_pk == second_pk:
        raise InvalidInput("invalid_value", f"A user cannot {action} themselves.")
    found = get_user_model()._default_manager.filter(pk__in=[first_pk, second_pk]).count()
    if found != 2:
        raise InvalidInput("unknown_users", f"No user has the id {first_pk} or {second_pk}.")
    return first_pk, second_pk


def _follow(owner: Any, target: Any) -> bool:
    owner_pk, target_pk = _two_users(owner, target, "follow")
    _, created = Contact.objects.get_or_create(owner_id=owner_pk, contact_id=target_pk)
    return created


def _unfollow(owner: Any, target: Any) -> bool:
    # A queryset delete sends post_delete for each row (presence listens to it).
    deleted, _ = Contact.objects.filter(owner_id=_pk(owner), contact_id=_pk(target)).delete()
    return deleted > 0


def _set_close_friend(owner: Any, target: Any, close_friend: bool) -> bool:
    owner_pk, target_pk = _two_users(owner, target, "befriend")
    if not close_friend:
        # Unmarking follows no one: a stranger stays a stranger (a contact would see more).
        found = Contact.objects.filter(owner_id=owner_pk, contact_id=target_pk).first()
        if found is None or not found.close_friend:
            return False
        found.close_friend = False
        found.save(update_fields=["close_friend"])
        return True
    contact, created = Contact.objects.get_or_create(
        owner_id=owner_pk, contact_id=target_pk, defaults={"close_friend": close_friend}
    )
    if created or contact.close_friend == close_friend:
        return created
    contact.close_friend = close_friend
    contact.save(update_fields=["close_friend"])
    return True


def _block(blocker: Any, blocked: Any) -> bool:
    blocker_pk, blocked_pk = _two_users(blocker, blocked, "block")
    _, created = Block.objects.get_or_create(blocker_id=blocker_pk, blocked_id=blocked_pk)
    return created


def _unblock(blocker: Any, blocked: Any) -> bool:
    deleted, _ = Block.objects.filter(blocker_id=_pk(blocker), blocked_id=_pk(blocked)).delete()
    return deleted > 0


def follow(owner: Any, target: Any) -> bool:
    """``owner`` adds ``target`` to its contacts (follows it). True if that changed anything.

    Saves the row like the admin does, so open connections see the change after commit. With
    the default ``contacts`` visibility, ``target`` now sees ``owner`` online; two users who
    follow each other are friends (``online_friends``)."""
    return run(call(_follow, owner, target))


async def afollow(owner: Any, target: Any) -> bool:
    return await arun(call(_follow, owner, target))


def unfollow(owner: Any, target: Any) -> bool:
    """``owner`` removes ``target`` from its contacts (and close friends). True if it was one."""
    return run(call(_unfollow, owner, target))


async def aunfollow(owner: Any, target: Any) -> bool:
    return await arun(call(_unfollow, owner, target))


def set_close_friend(owner: Any, target: Any, close_friend: bool = True) -> bool:
    """Mark ``target`` as one of ``owner``'s close friends, following it if needed; with
    ``close_friend=False`` unmark it (it stays a contact; a user who is not one stays not
    one). True if that changed anything."""
    return run(call(_set_close_friend, owner, target, close_friend))


async def aset_close_friend(owner: Any, target: Any, close_friend: bool = True) -> bool:
    return await arun(call(_set_close_friend, owner, target, close_friend))


def block(blocker: Any, blocked: Any) -> bool:
    """``blocker`` blocks ``blocked``: each is hidden from the other (offline, no last seen, no
    custom status, no diffs). True if it was not blocked yet."""
    return run(call(_block, blocker, blocked))


async def ablock(blocker: Any, blocked: Any) -> bool:
    return await arun(call(_block, blocker, blocked))


def unblock(blocker: Any, blocked: Any) -> bool:
    """Lift ``blocker``'s block of ``blocked``. True if there was one."""
    return run(call(_unblock, blocker, blocked))


async def aunblock(blocker: Any, blocked: Any) -> bool:
    return await arun(call(_unblock, blocker, blocked))


def _notify_changed(users: Iterable[Any], reason: str) -> None:
    user_ids = _target_ids(users)
    if user_ids:
        transaction.on_commit(lambda: announce.changed(user_ids, reason))


def notify_changed(users: Iterable[Any], reason: str = "bulk") -> None:
    """Tell open connections that what others may see of ``users`` may have changed.

    Presence hears about changes to its models through ``post_save``/``post_delete``; a
    ``QuerySet.update()``, ``bulk_create``/``bulk_update``, a queryset ``delete()`` of rows
    without signals, or raw SQL sends none, so a site calls this after such a write (of
    PrivacySettings, Contact, Block or UserStatus rows). ``users`` are users or ids: every user
    whose presence others see differently (for a Contact, its owner; for a Block, both users;
    with rooms, a Contact's contact too: its owner's room lists put their contacts first).
    After the current transaction commits (right away outside one), pushes diffs to open
    WebSockets and sends :data:`presence.signals.presence_changed` with ``reason`` for each.
    """
    run(call(_notify_changed, users, reason))


async def anotify_changed(users: Iterable[Any], reason: str = "bulk") -> None:
    await arun(call(_notify_changed, list(users), reason))
