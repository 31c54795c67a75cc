"""Signals presence sends, and the receivers it connects (from ``AppConfig.ready``)."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import Signal, receiver

logger = logging.getLogger("presence")

#: Sent after commit when what others may see of ``user_id`` may have changed for a reason other
#: than activity: ``reason`` is "status" (set_status), "privacy" (PrivacySettings saved or
#: deleted), "contacts" (a Contact of user_id's added, changed or removed) or "block" (sent for
#: both users). One change can send more than one (set_status also saves PrivacySettings);
#: listeners should coalesce. The live layer listens to push updates to open connections.
presence_changed = Signal()


def _device(request: Any) -> str:
    from presence.domain import device_from_user_agent

    meta = getattr(request, "META", None) or {}
    return device_from_user_agent(meta.get("HTTP_USER_AGENT")).value


@receiver(user_logged_in, dispatch_uid="presence_logged_in")
def _on_login(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    from presence import api
    from presence.middleware import throttle

    # Online right away, whatever the throttle remembers; the next pages need not write again.
    throttle.forget(user.pk)
    try:
        api.touch(user, _device(request))
    except Exception:  # the store fails open for outages; this guards anything else
        logger.exception("Presence: could not record the login of user %s", user.pk)
        return
    throttle.mark(user.pk)


@receiver(user_logged_out, dispatch_uid="presence_logged_out")
def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or not getattr(user, "is_authenticated", False):
        return
    from presence import api
    from presence.middleware import throttle

    # Another session of the same user must be recorded again on its next request.
    throttle.forget(user.pk)
    session = getattr(request, "session", None)
    session_key = getattr(session, "session_key", None)
    if session_key:
        # Sent before Django flushes the session: its open sockets close with 4401, in every
        # process; the user's other sessions keep theirs.
        from presence import live

        try:
            live.announce_session_ended(int(user.pk), session_key)
        except Exception:
            logger.exception("Presence: could not close the sockets of user %s", user.pk)
    try:
        api.sign_off(user, _device(request))
    except Exception:  # logging out must never fail because of presence
        logger.exception("Presence: could not record the logout of user %s", user.pk)


def _changed(sender: Any, user_ids: tuple[int, ...], reason: str) -> None:
    from django.db import transaction

    def send() -> None:
        for user_id in user_ids:
            presence_changed.send(sender=sender, user_id=user_id, reason=reason)

    # After commit: listeners re-read the database and must see the change.
    transaction.on_commit(send)


def _on_privacy_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    _changed(sender, (instance.user_id,), "privacy")


def _on_contact_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    # Only the owner's presence changes for someone: who may see it depends on its contacts.
    _changed(sender, (instance.owner_id,), "contacts")


def _on_block_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _changed(sender, (instance.blocker_id, instance.blocked_id), "block")


_SESSION_FIELDS = {"password", "is_active"}


def _on_user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if created or (update_fields is not None and not _SESSION_FIELDS & set(update_fields)):
        return  # e.g. login's last_login update: sessions cannot have changed
    from django.db import transaction

    from presence import live

    user_id = int(instance.pk)
    # A password change (or deactivation) invalidates sessions: open sockets check theirs.
    transaction.on_commit(lambda: live.announce_sessions_changed(user_id))


def connect_model_signals() -> None:
    """Send ``presence_changed`` whenever a row deciding who sees whom changes."""
    from django.contrib.auth import get_user_model
    from django.db.models.signals import post_delete, post_save

    from presence.models import Block, Contact, PrivacySettings

    post_save.connect(
        _on_user_saved, sender=get_user_model(), dispatch_uid="presence_user_sessions"
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
