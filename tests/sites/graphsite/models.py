"""A site's own follow model, standing in for any site's graph (docs/api.md, "A site's own
graph"): presence is kept in sync through receivers calling presence.api."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Follow(models.Model):
    follower = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="graphsite_following"
    )
    followed = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="graphsite_followers"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["follower", "followed"], name="graphsite_follow_once")
        ]

    def __str__(self) -> str:
        return f"{self.follower_id} follows {self.followed_id}"
