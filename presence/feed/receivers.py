"""The receivers the feed connects (from ``FeedConfig.ready``), at the edge of the app: with
``RECORD_STATUS_ACTIVITIES`` on, a change of a user's custom status text is posted as an
activity of kind ``status``."""

from __future__ import annotations

import logging
from typing import Any

from django.db import router, transaction
from django.db.models.signals import post_save, pre_save
from django.utils import timezone

from presence.feed.api import post
from presence.feed.conf import get_settings
from presence.feed.models import Activity, ActivityKind
from presence.models import UserStatus

logger = logging.getLogger("presence")

_OLD_TEXT = "_presence_feed_old_text"


def _status_before_save(
    sender: Any, instance: UserStatus, raw: bool = False, **kwargs: Any
) -> None:
    if raw or not get_settings().RECORD_STATUS_ACTIVITIES:
        return
    setattr(instance, _OLD_TEXT, _shown_text(instance.pk))


def _shown_text(pk: Any) -> str:
    """The saved row's custom status text, "" once it cleared: a text past its expiry is shown
    to nobody, so setting it again is a change (as the resolver sees it)."""
    row = (
        UserStatus.objects.filter(pk=pk).values_list("text", "expires_at").first()
        if pk is not None
        else None
    )
    if row is None:
        return ""
    text, expires_at = row
    if expires_at is not None and expires_at <= timezone.now():
        return ""
    return text or ""


def _status_saved(sender: Any, instance: UserStatus, raw: bool = False, **kwargs: Any) -> None:
    if raw or not hasattr(instance, _OLD_TEXT):
        return
    old, new = getattr(instance, _OLD_TEXT), instance.text
    delattr(instance, _OLD_TEXT)
    if not new or new == old:
        return
    user_id = instance.user_id

    def record() -> None:
        try:
            post(user_id, new, kind=ActivityKind.STATUS)
        except Exception:  # a status change must never fail because of the feed
            logger.exception("Presence: could not record the status of user %s", user_id)

    transaction.on_commit(record, using=router.db_for_write(Activity))


def connect() -> None:
    """Record custom status text changes as activities when ``RECORD_STATUS_ACTIVITIES`` is on
    (connected from ``AppConfig.ready``; the setting is read at each save)."""
    pre_save.connect(
        _status_before_save, sender=UserStatus, dispatch_uid="presence_feed_status_pre"
    )
    post_save.connect(_status_saved, sender=UserStatus, dispatch_uid="presence_feed_status_post")
