"""The recipe of docs/api.md, "A site's own graph", as a site writes it: presence follows the
site's own Follow rows."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from presence import api
from tests.sites.graphsite.models import Follow


@receiver(post_save, sender=Follow, dispatch_uid="graphsite_follow")
def followed(sender: Any, instance: Follow, created: bool, **kwargs: Any) -> None:
    if created:
        api.follow(instance.follower_id, instance.followed_id)


@receiver(post_delete, sender=Follow, dispatch_uid="graphsite_unfollow")
def unfollowed(sender: Any, instance: Follow, **kwargs: Any) -> None:
    api.unfollow(instance.follower_id, instance.followed_id)
