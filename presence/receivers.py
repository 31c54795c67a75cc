"""The receivers presence connects (from ``PresenceConfig.ready``), at the edge of the package.

- login and logout record presence (and logout closes that session's open sockets);
- a password change or deactivation makes open sockets check their sessions;
- deleting a user erases their presence after commit and closes their sockets;
- saving or deleting PrivacySettings, PrivacyException, Contact, Block or UserStatus (a row
  the site or the admin saves; the API announces its own) is announced to the live processes
  after commit, then ``presence_changed`` sent (the hook for sites);
- a ``presence_changed`` a site sends itself is announced too.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save

from presence import announce, api, domain, lifecycle
from presence.api._status import saving_through_the_api, status_row_changed
from presence.conf import get_settings
from presence.domain import UserId, device_from_user_agent
from presence.middleware import listener, throttle
from presence.models import (
    Block,
    Contact,
    PrivacyException,
    PrivacySettings,
    UserStatus,
    privacy_defaults,
)
from presence.signals import presence_changed
from presence.users import user_pk

logger = logging.getLogger("presence")


def _device(request: Any) -> str:
    meta = getattr(request, "META", None) or {}
    return device_from_user_agent(meta.get("HTTP_USER_AGENT")).value


def _on_login(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    # Online right away, whatever the throttle remembers; the next pages need not write again.
    throttle.forget(user.pk)
    device = _device(request)
    try:
        api.touch(user, device)
    except Exception:  # the store fails open for outages; this guards anything else
        logger.exception("Presence: could not record the login of user %s", user.pk)
        return
    listener.ensure()  # so that the mark below is trusted (presence.closes)
    throttle.mark(user.pk, device=device)


def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or not getattr(user, "is_authenticated", False):
        return
    # Another session of the same user must be recorded again on its next request.
    throttle.forget(user.pk)
    session = getattr(request, "session", None)
    session_key = getattr(session, "session_key", None)
    if session_key:
        # Sent before Django flushes the session: its open sockets close with 4401, in every
        # process; the user's other sessions keep theirs.
        try:
            announce.announce_session_ended(user_pk(user), session_key)
        except Exception:
            logger.exception("Presence: could not close the sockets of user %s", user.pk)
    try:
        api.sign_off(user, _device(request))
    except Exception:  # logging out must never fail because of presence
        logger.exception("Presence: could not record the logout of user %s", user.pk)


def _changed(
    sender: Any,
    user_ids: tuple[UserId, ...],
    reason: str,
    reordered: tuple[UserId, ...] = (),
    change: announce.Changes = domain.ANY_CHANGE,
) -> None:
    # After commit: the hubs and the signal's receivers re-read the database.
    transaction.on_commit(lambda: announce.changed(user_ids, reason, sender, reordered, change))


def _between(
    one: UserId, other: UserId, both: bool, block: bool = False
) -> dict[UserId, domain.Change]:
    """A change of the relation of ``one`` with ``other`` (``both``: and of ``other``'s with
    ``one``; ``block``: a block between them made or lifted): no one else's view of them
    changes."""
    changes = {one: domain.relation_change((other,), block)}
    if both:
        changes[other] = domain.relation_change((one,), block)
    return changes


#: the attribute a PrivacySettings being saved or deleted keeps its row's choices in until then
_BEFORE = "_presence_choices_before"


def _on_privacy_saving(sender: Any, instance: Any, **kwargs: Any) -> None:
    # The row as it stands, read just before it changes (None: no row, the site's defaults).
    row = (
        sender._default_manager.using(kwargs.get("using"))
        .filter(pk=instance.pk)
        .values(*domain.VISIBILITY_SETTINGS, "invisible")
        .first()
    )
    setattr(instance, _BEFORE, None if row is None else _levels(SimpleNamespace(**row)))


def _on_privacy_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    # What changed, for whom: a viewer whose permissions the new levels leave as they were is
    # not told (domain.levels_change). A user without a row had the site's defaults.
    before = getattr(instance, _BEFORE, None) or privacy_defaults()
    deleted = kwargs["signal"] is post_delete
    after = privacy_defaults() if deleted else _levels(instance)
    setattr(instance, _BEFORE, None)
    change = domain.levels_change(before, after)
    _changed(sender, (instance.user_id,), "privacy", change=change)
    # The online count leaves invisible users out: its copy of the choice, after commit.
    user_id, invisible = instance.user_id, instance.invisible and not deleted
    transaction.on_commit(lambda: api.note_invisible(user_id, invisible))


def _levels(row: Any) -> domain.Choices:
    """The levels and invisibility of a PrivacySettings row (its values the levels' text), as
    the resolver takes them."""
    return domain.Choices(
        online_visibility=domain.Visibility(row.online_visibility),
        last_seen_visibility=domain.Visibility(row.last_seen_visibility),
        activity_visibility=domain.Visibility(row.activity_visibility),
        invisible=row.invisible,
    )


#: the attribute a Contact being saved keeps its row's close_friend in until then (None: new)
_CLOSE_BEFORE = "_presence_close_friend_before"


def _on_contact_saving(sender: Any, instance: Any, **kwargs: Any) -> None:
    row = (
        sender._default_manager.using(kwargs.get("using"))
        .filter(pk=instance.pk)
        .values_list("close_friend", flat=True)
        .first()
        if instance.pk is not None
        else None
    )
    setattr(instance, _CLOSE_BEFORE, row)


def _close_friend_shows_nothing(instance: Any) -> bool:
    """Whether the save only marked or unmarked a close friend, where the owner's levels show
    close friends what they show contacts (for every setting the contact has no exception
    for): nothing the contact sees changes, so no viewer is told (not even that it happened).
    With RECIPROCAL_LAST_SEEN what the owner sees of them may change: told."""
    before = getattr(instance, _CLOSE_BEFORE, None)
    setattr(instance, _CLOSE_BEFORE, None)
    if before is None or before == instance.close_friend:
        return False
    if get_settings().RECIPROCAL_LAST_SEEN is not False:
        return False
    row = PrivacySettings.objects.filter(user_id=instance.owner_id).first()
    levels = privacy_defaults() if row is None else _levels(row)
    excepted = PrivacyException.objects.filter(
        owner_id=instance.owner_id, viewer_id=instance.contact_id
    ).values_list("setting", flat=True)
    return not domain.close_friend_shows_more(levels, excepted)


def _on_contact_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    # Only the owner's presence changes for someone: who may see it depends on its contacts
    # (with RECIPROCAL_LAST_SEEN, what the owner sees of the contact too).
    # The contact's place in the owner's room lists changes either way (a list puts its
    # viewer's contacts first): the rooms look at the contact again too (announce.room_users).
    if kwargs.get("signal") is post_save and _close_friend_shows_nothing(instance):
        # Announced (presence_changed's receivers hear of it) as a change no viewer sees.
        unseen = {instance.owner_id: domain.relation_change(())}
        _changed(sender, (instance.owner_id,), "contacts", (), unseen)
        return
    both = get_settings().RECIPROCAL_LAST_SEEN is True
    changes = _between(instance.owner_id, instance.contact_id, both)
    _changed(sender, tuple(changes), "contacts", (instance.contact_id,), changes)


def _on_exception_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    # The owner's presence changes for the viewer (with RECIPROCAL_LAST_SEEN, the viewer's
    # presence for the owner too): the route of a privacy change.
    both = get_settings().RECIPROCAL_LAST_SEEN is True
    changes = _between(instance.owner_id, instance.viewer_id, both)
    _changed(sender, tuple(changes), "privacy", change=changes)


def _on_block_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    changes = _between(instance.blocker_id, instance.blocked_id, True, block=True)
    _changed(sender, tuple(changes), "block", change=changes)


#: the attribute a UserStatus being saved keeps its row's fields in until then (None: no row)
_STATUS_BEFORE = "_presence_status_before"


def _status_fields(row: Any) -> dict[str, Any]:
    return {name: getattr(row, name) for name in domain.STATUS_FIELDS}


def _on_status_saving(sender: Any, instance: Any, **kwargs: Any) -> None:
    if saving_through_the_api() or kwargs.get("raw"):
        return
    row = (
        sender._default_manager.using(kwargs.get("using"))
        .filter(pk=instance.pk)
        .values(*domain.STATUS_FIELDS)
        .first()
    )
    setattr(instance, _STATUS_BEFORE, row)


def _on_status_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    # A moderator clearing an abusive text in the admin, a site's own row.save(): watchers'
    # sockets are told as set_status tells them (only those who may see what changed).
    if saving_through_the_api() or kwargs.get("raw"):
        return
    # What the row held as it went (read by the pre_ receiver: an instance loaded earlier may
    # be older than the row).
    before = getattr(instance, _STATUS_BEFORE, None)
    setattr(instance, _STATUS_BEFORE, None)
    after = None if kwargs["signal"] is post_delete else _status_fields(instance)
    status_row_changed(instance.user_id, before, after)


_SESSION_FIELDS = {"password", "is_active"}


def _on_user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if created or (update_fields is not None and not _SESSION_FIELDS & set(update_fields)):
        return  # e.g. login's last_login update: sessions cannot have changed
    user_id = user_pk(instance)
    # A password change (or deactivation) invalidates sessions: open sockets check theirs.
    transaction.on_commit(lambda: announce.announce_sessions_changed(user_id))


def _on_user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    # The pk is read now (Django clears it once the delete is done), in the site's pk type (a
    # UUID stays a UUID); the erase waits for the commit: a delete rolled back erases nothing.
    user_id = user_pk(instance)
    transaction.on_commit(lambda: _erase_deleted(user_id), using=kwargs.get("using"))


def _erase_deleted(user_id: UserId) -> None:
    try:
        lifecycle.user_deleted(user_id)
    except Exception:  # deleting a user must never fail because of presence
        logger.exception("Presence: could not erase the presence of deleted user %s", user_id)


def _on_site_presence_changed(sender: Any, user_id: UserId, reason: str, **kwargs: Any) -> None:
    # Presence announces its own changes itself (announce.changed) before sending the signal;
    # a site sending presence_changed for a change of its own is announced here.
    if not announce.announced_already(user_id, reason):
        announce.announce([user_id])


def connect() -> None:
    """Connect every receiver (idempotent: each has a dispatch_uid)."""
    user_logged_in.connect(_on_login, dispatch_uid="presence_logged_in")
    user_logged_out.connect(_on_logout, dispatch_uid="presence_logged_out")
    presence_changed.connect(_on_site_presence_changed, dispatch_uid="presence_live_announce")
    post_save.connect(
        _on_user_saved, sender=get_user_model(), dispatch_uid="presence_user_sessions"
    )
    post_delete.connect(
        _on_user_deleted, sender=get_user_model(), dispatch_uid="presence_user_deleted"
    )

    for signal in (pre_save, pre_delete):
        signal.connect(
            _on_privacy_saving,
            sender=PrivacySettings,
            dispatch_uid=f"presence_privacy_before_{signal is pre_save}",
        )
    pre_save.connect(_on_contact_saving, sender=Contact, dispatch_uid="presence_contact_before")
    for signal in (pre_save, pre_delete):
        signal.connect(
            _on_status_saving,
            sender=UserStatus,
            dispatch_uid=f"presence_status_before_{signal is pre_save}",
        )
    for signal in (post_save, post_delete):
        signal.connect(
            _on_privacy_saved,
            sender=PrivacySettings,
            dispatch_uid=f"presence_privacy_{signal is post_save}",
        )
        signal.connect(
            _on_contact_changed,
            sender=Contact,
            dispatch_uid=f"presence_contact_{signal is post_save}",
        )
        signal.connect(
            _on_block_changed, sender=Block, dispatch_uid=f"presence_block_{signal is post_save}"
        )
        signal.connect(
            _on_status_changed,
            sender=UserStatus,
            dispatch_uid=f"presence_status_{signal is post_save}",
        )
        signal.connect(
            _on_exception_changed,
            sender=PrivacyException,
            dispatch_uid=f"presence_privacy_exception_{signal is post_save}",
        )
