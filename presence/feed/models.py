"""The activity feed's models (app label ``presence_feed``).

Following is presence's ``Contact`` (owner follows contact). Timelines are computed at read time
from these rows (see :mod:`presence.feed.api`): no activity is ever copied per follower or per
group. Table names are the app's (``presence_feed_*``); the index and constraint names are the
ones the feed had inside ``presence`` (a database upgraded from it keeps them).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class Group(models.Model):
    """A group of people; its timeline shows the activities of its current members."""

    name = models.CharField(_("name"), max_length=100)
    slug = models.SlugField(_("slug"), max_length=100, unique=True)
    description = models.TextField(_("description"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        through="Membership",
        related_name="presence_groups",
        verbose_name=_("members"),
    )

    class Meta:
        verbose_name = _("group")
        verbose_name_plural = _("groups")
        ordering = ["name", "pk"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    group = models.ForeignKey(
        Group,
        on_delete=models.CASCADE,
        related_name="memberships",
        verbose_name=_("group"),
        db_index=False,  # the unique constraint's (group, user) index serves it
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_memberships",
        verbose_name=_("user"),
        db_index=False,  # the (user, group) index serves it
    )
    joined_at = models.DateTimeField(_("joined at"), auto_now_add=True)

    class Meta:
        verbose_name = _("membership")
        verbose_name_plural = _("memberships")
        # group -> members (the group timeline) is served by the unique constraint's index;
        # this one serves "the groups of a user".
        constraints = [
            models.UniqueConstraint(fields=["group", "user"], name="presence_membership_unique")
        ]
        indexes = [models.Index(fields=["user", "group"], name="presence_membership_user")]

    def __str__(self) -> str:
        return f"{self.user} ∈ {self.group}"


class ActivityKind(models.TextChoices):
    POST = "post", _("post")
    #: a change of custom status text, recorded when PRESENCE_FEED["RECORD_STATUS_ACTIVITIES"] is on
    STATUS = "status", _("status")


class Activity(models.Model):
    """A short update by ``author``. Who may see it follows the author's ``activity_visibility``
    and blocks, decided when it is read (presence.feed.api)."""

    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_activities",
        verbose_name=_("author"),
        db_index=False,  # the (author, created_at, id) index serves it
    )
    #: at most PRESENCE_FEED["ACTIVITY_MAX_LENGTH"] characters, checked by presence.feed.api.post (a
    #: setting, so not a column limit)
    text = models.TextField(_("text"))
    kind = models.CharField(
        _("kind"), max_length=16, choices=ActivityKind.choices, default=ActivityKind.POST
    )
    created_at = models.DateTimeField(_("created at"), default=timezone.now)

    class Meta:
        verbose_name = _("activity")
        verbose_name_plural = _("activities")
        indexes = [
            # Every timeline pages through this one, newest first, author by author
            # (a keyset on (created_at, id) below a cursor: an index range scan).
            models.Index(fields=["author", "-created_at", "-id"], name="presence_activity_author"),
            # Newest first across all authors (the admin's list).
            models.Index(fields=["-created_at", "-id"], name="presence_activity_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.author}: {self.text[:50]}"


class Mention(models.Model):
    """``activity`` mentions ``user`` (an ``@username`` in its text), stored once per user."""

    activity = models.ForeignKey(
        Activity,
        on_delete=models.CASCADE,
        related_name="mentions",
        verbose_name=_("activity"),
        db_index=False,  # the unique constraint's (activity, user) index serves it
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_mentions",
        verbose_name=_("mentioned user"),
        db_index=False,  # the (user, created_at, activity) index serves it
    )
    #: the activity's created_at, copied once when it is posted, so the mentions timeline pages
    #: through the (user, created_at, activity) index without sorting all of a user's mentions
    created_at = models.DateTimeField(_("created at"))
    #: where the text names the user, ``[[start, end], ...]`` (``text[start:end]`` is the
    #: ``@name``), recorded when posted: rendering links exactly these. None for a mention
    #: recorded otherwise (added in the admin, or before migration 0002, or the text edited
    #: since): rendering then looks for the user's handle in the text.
    spans = models.JSONField(_("places in the text"), null=True, default=None, editable=False)

    class Meta:
        verbose_name = _("mention")
        verbose_name_plural = _("mentions")
        # activity -> mentioned users (rendering) is served by the unique constraint's index.
        constraints = [
            models.UniqueConstraint(fields=["activity", "user"], name="presence_mention_unique")
        ]
        indexes = [
            models.Index(fields=["user", "-created_at", "-activity"], name="presence_mention_user")
        ]

    def __str__(self) -> str:
        return f"{self.activity_id} @ {self.user}"
