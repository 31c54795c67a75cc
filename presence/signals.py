"""Signals presence sends, and the receivers it connects (from ``AppConfig.ready``)."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import Signal, receiver

logger = logging.getLogger("presence")

#: Sent after a user's visible presence may have changed for a reason other than activity
#: (``reason``: "status", "privacy", "contacts", "block"), with ``user_id``. The live layer
#: listens to push updates to open connections.
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
    try:
        api.sign_off(user, _device(request))
    except Exception:  # logging out must never fail because of presence
        logger.exception("Presence: could not record the logout of user %s", user.pk)
