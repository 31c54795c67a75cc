"""Signals presence sends, and the receivers it connects (from ``AppConfig.ready``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import Signal, receiver

#: Sent after a user's visible presence may have changed for a reason other than activity
#: (``reason``: "status", "privacy", "contacts", "block"), with ``user_id``. The live layer
#: listens to push updates to open connections.
presence_changed = Signal()


def _device(request: Any) -> str:
    from presence.domain import device_from_user_agent

    user_agent = request.META.get("HTTP_USER_AGENT") if request is not None else None
    return device_from_user_agent(user_agent).value


@receiver(user_logged_in, dispatch_uid="presence_logged_in")
def _on_login(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    from presence import api
    from presence.middleware import throttle

    throttle.forget(user.pk)
    api.touch(user, _device(request))
    throttle.mark(user.pk)


@receiver(user_logged_out, dispatch_uid="presence_logged_out")
def _on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None or not getattr(user, "is_authenticated", False):
        return
    from presence import api
    from presence.middleware import throttle

    throttle.forget(user.pk)
    api.sign_off(user, _device(request))
