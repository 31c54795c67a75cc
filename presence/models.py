from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, models, router, transaction
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from presence import domain
from presence.conf import PresenceSettings, get_settings
from presence.domain import UserId

VISIBILITY_CHOICES = [(v.value, label) for v, label in domain.VISIBILITY_LABELS.items()]

#: the settings privacy_defaults() was last computed from, and its answer
_computed_defaults: tuple[PresenceSettings, domain.Choices] | None = None


def privacy_defaults() -> domain.Choices:
    """The choices of a user without a PrivacySettings row: the site's DEFAULT_PRIVACY levels
    ("contacts" for a setting it leaves out), not invisible. What every read path applies to
    such a user (presence.relations, presence.privacy.visible_to) and what a row created
    without explicit values starts from (the fields' defaults below).

    Computed once per settings object: presence.conf's cache is cleared when PRESENCE changes."""
    global _computed_defaults
    conf = get_settings()
    computed = _computed_defaults
    if computed is None or computed[0] is not conf:
        computed = _computed_defaults = (conf, domain.default_choices(conf.DEFAULT_PRIVACY))
    return computed[1]


# The fields' defaults are these functions, by reference (migrations name them and never bake
# in a site's DEFAULT_PRIVACY): a row created without explicit values starts from the default.
def default_online_visibility() -> str:
    return privacy_defaults().online_visibility.value


def default_last_seen_visibility() -> str:
    return privacy_defaults().last_seen_visibility.value


def default_activity_visibility() -> str:
    return privacy_defaults().activity_visibility.value


class PrivacySettings(models.Model):
    """Who may see a user's presence. A user without a row has the defaults
    (:func:`privacy_defaults`: the site's DEFAULT_PRIVACY, else "contacts")."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="presence_privacy",
        verbose_name=_("user"),
    )
    online_visibility = models.CharField(
        _("who sees when I am online"),
        max_length=16,
        choices=VISIBILITY_CHOICES,
        default=default_online_visibility,
    )
    last_seen_visibility = models.CharField(
        _("who sees my last seen"),
        max_length=16,
        choices=VISIBILITY_CHOICES,
        default=default_last_seen_visibility,
    )
    activity_visibility = models.CharField(
        _("who sees my custom status and activity"),
        max_length=16,
        choices=VISIBILITY_CHOICES,
        default=default_activity_visibility,
    )
    invisible = models.BooleanField(
        _("invisible"),
        default=False,
        help_text=_("Look offline to everyone while still using the site."),
    )

    class Meta:
        verbose_name = _("privacy settings")
        verbose_name_plural = _("privacy settings")

    def __str__(self) -> str:
        return str(self.user)


class UserStatus(models.Model):
    """A user's chosen status (do not disturb) and custom status text.

    Kept in the database, not Redis: it is the user's choice, and must survive a Redis flush.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="presence_status",
        verbose_name=_("user"),
    )
    dnd = models.BooleanField(_("do not disturb"), default=False)
    text = models.CharField(_("status text"), max_length=255, blank=True, default="")
    emoji = models.CharField(_("status emoji"), max_length=32, blank=True, default="")
    activity = models.CharField(_("activity"), max_length=255, blank=True, default="")
    expires_at = models.DateTimeField(
        _("custom status expires at"),
        null=True,
        blank=True,
        help_text=_("Text, emoji and activity clear at this time. Empty: never."),
    )
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("user status")
        verbose_name_plural = _("user statuses")

    def __str__(self) -> str:
        return str(self.user)


class Contact(models.Model):
    """``owner`` added (follows) ``contact``. Friends are mutual contacts."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_contacts",
        verbose_name=_("owner"),
    )
    contact = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_followers",
        verbose_name=_("contact"),
    )
    close_friend = models.BooleanField(_("close friend"), default=False)
    created_at = models.DateTimeField(_("added at"), auto_now_add=True)

    class Meta:
        verbose_name = _("contact")
        verbose_name_plural = _("contacts")
        constraints = [
            models.UniqueConstraint(fields=["owner", "contact"], name="presence_contact_unique"),
            models.CheckConstraint(
                condition=~Q(owner=F("contact")), name="presence_contact_not_self"
            ),
        ]
        # owner -> contacts is served by the unique constraint's index; this one serves
        # "who has X among their contacts" (privacy checks, friends).
        indexes = [models.Index(fields=["contact", "owner"], name="presence_contact_rev")]

    def __str__(self) -> str:
        return f"{self.owner} → {self.contact}"


class Block(models.Model):
    """A block in either direction hides each user from the other."""

    blocker = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_blocks",
        verbose_name=_("blocker"),
    )
    blocked = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_blocked_by",
        verbose_name=_("blocked user"),
    )
    created_at = models.DateTimeField(_("blocked at"), auto_now_add=True)

    class Meta:
        verbose_name = _("block")
        verbose_name_plural = _("blocks")
        constraints = [
            models.UniqueConstraint(fields=["blocker", "blocked"], name="presence_block_unique"),
            models.CheckConstraint(
                condition=~Q(blocker=F("blocked")), name="presence_block_not_self"
            ),
        ]
        indexes = [models.Index(fields=["blocked", "blocker"], name="presence_block_rev")]

    def __str__(self) -> str:
        return f"{self.blocker} ⊘ {self.blocked}"


PRIVACY_EXCEPTION_SETTINGS = [
    ("online_visibility", _("who sees when I am online")),
    ("last_seen_visibility", _("who sees my last seen")),
    ("activity_visibility", _("who sees my custom status and activity")),
]


class PrivacyException(models.Model):
    """``owner``'s exception to one of their levels for one ``viewer``, as messengers have it:
    "always share with" (``allow``) or "never share with". A block beats both; ``invisible``
    beats an allow."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_privacy_exceptions",
        verbose_name=_("owner"),
    )
    viewer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="presence_privacy_exceptions_for",
        verbose_name=_("viewer"),
    )
    setting = models.CharField(_("setting"), max_length=32, choices=PRIVACY_EXCEPTION_SETTINGS)
    allow = models.BooleanField(
        _("always share"),
        default=True,
        help_text=_("Checked: always share with this viewer. Unchecked: never share."),
    )

    class Meta:
        verbose_name = _("privacy exception")
        verbose_name_plural = _("privacy exceptions")
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "viewer", "setting"], name="presence_privacy_exception_unique"
            ),
            models.CheckConstraint(
                condition=~Q(owner=F("viewer")), name="presence_privacy_exception_not_self"
            ),
        ]
        # owner -> rows is served by the unique constraint's index; this one serves the
        # relations' subqueries by viewer (the reciprocity direction reads owner=viewer too).
        indexes = [
            models.Index(fields=["viewer", "owner"], name="presence_privexc_viewer"),
        ]

    def __str__(self) -> str:
        verb = "✓" if self.allow else "✗"
        return f"{self.owner} {verb} {self.viewer} ({self.setting})"


class LastSeenManager(models.Manager):
    #: rows per INSERT statement (SQLite allows 32766 parameters)
    BATCH = 500

    def record_many(self, seen: Mapping[UserId, float]) -> int:
        """Upsert last seen times (epoch seconds), never moving one backwards.

        A time of a later UTC day than the stored one keeps the stored one as ``prior_seen_at``
        (domain.carry_last_seen: the approximate last seen counts from it until midnight). Ids
        of users that no longer exist are skipped. Safe to run concurrently: the database keeps
        the greater time, and the update is one statement per row. Returns the number of users
        written.
        """
        if not seen:
            return 0
        alias = router.db_for_write(self.model)
        user_model = get_user_model()
        ids: list[Any] = list(seen)  # Any: the site's pk type (presence.users.user_pk)
        existing: set[UserId] = set()
        # Chunked: SQLite builds without a raised limit allow 32,766 parameters a query.
        for start in range(0, len(ids), 10_000):
            existing.update(
                user_model._default_manager.using(alias)
                .filter(pk__in=ids[start : start + 10_000])
                .values_list("pk", flat=True)
            )
        rows = [
            (user_id, datetime.fromtimestamp(ts, tz=UTC))
            for user_id, ts in seen.items()
            if user_id in existing
        ]
        connection = connections[alias]
        vendor = connection.vendor
        table = connection.ops.quote_name(self.model._meta.db_table)
        if vendor not in _DAY_OF:
            return self._record_portably(rows, alias)
        day, greatest = _DAY_OF[vendor], _GREATEST[vendor]
        if vendor == "mysql":
            old, new, conflict = "", "VALUES(seen_at)", "ON DUPLICATE KEY UPDATE"
        else:
            old, new, conflict = (
                f"{table}.",
                "excluded.seen_at",
                "ON CONFLICT (user_id) DO UPDATE SET",
            )
        # The prior first: MySQL's assignments see the ones made before them.
        conflict += (
            f" prior_seen_at = CASE"
            f" WHEN {day.format(f'{old}seen_at')} < {day.format(new)} THEN {old}seen_at"
            f" WHEN {day.format(new)} < {day.format(f'{old}seen_at')}"
            f" THEN {greatest}(COALESCE({old}prior_seen_at, {new}), {new})"
            f" ELSE {old}prior_seen_at END,"
            f" seen_at = {greatest}({old}seen_at, {new})"
        )
        # The pk as the column holds it (a UUID is char(32) on SQLite, uuid on PostgreSQL).
        user_column: Any = self.model._meta.get_field("user")
        # Each batch is a statement of its own, committed at once (no transaction around them
        # all): SQLite has one write lock for the whole database, and the site's requests take
        # it between batches instead of waiting for every batch (presence.W005).
        with connection.cursor() as cursor:
            for start in range(0, len(rows), self.BATCH):
                chunk = rows[start : start + self.BATCH]
                placeholders = ", ".join(["(%s, %s)"] * len(chunk))
                params: list[Any] = []
                for user_id, seen_at in chunk:
                    params += [
                        user_column.get_db_prep_value(user_id, connection),
                        connection.ops.adapt_datetimefield_value(seen_at),
                    ]
                cursor.execute(
                    f"INSERT INTO {table} (user_id, seen_at) VALUES {placeholders} {conflict}",
                    params,
                )
        return len(rows)

    def _record_portably(self, rows: list[tuple[UserId, datetime]], alias: str) -> int:
        with transaction.atomic(using=alias):
            for user_id, seen_at in rows:
                _, created = self.using(alias).get_or_create(
                    user_id=user_id, defaults={"seen_at": seen_at}
                )
                if created:
                    continue
                row: Any = self.using(alias).select_for_update().get(user_id=user_id)
                kept, prior = domain.carry_last_seen(
                    row.seen_at.timestamp(),
                    row.prior_seen_at.timestamp() if row.prior_seen_at else None,
                    seen_at.timestamp(),
                )
                row.seen_at = datetime.fromtimestamp(kept, tz=UTC)
                row.prior_seen_at = None if prior is None else datetime.fromtimestamp(prior, tz=UTC)
                row.save(using=alias, update_fields=["seen_at", "prior_seen_at"])
        return len(rows)


#: the UTC day of a datetime column, as SQL (times are stored in UTC: USE_TZ)
_DAY_OF = {
    "sqlite": "date({})",
    "postgresql": "date_trunc('day', {} AT TIME ZONE 'UTC')",
    "mysql": "DATE({})",
}
_GREATEST = {"sqlite": "max", "postgresql": "GREATEST", "mysql": "GREATEST"}


class LastSeen(models.Model):
    """Last seen persisted from Redis; survives a Redis flush. Only ever moves forward."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="presence_last_seen",
        verbose_name=_("user"),
    )
    seen_at = models.DateTimeField(_("last seen"), db_index=True)
    #: the last seen of a UTC day before seen_at's, replaced by a write of a later day: the
    #: approximate last seen counts from it until midnight (docs/privacy.md)
    prior_seen_at = models.DateTimeField(_("last seen on an earlier day"), null=True, blank=True)

    objects = LastSeenManager()

    class Meta:
        verbose_name = _("last seen")
        verbose_name_plural = _("last seen")
        permissions = [
            # The admin only (presence.admin): everywhere else privacy applies to everyone.
            ("view_true_presence", _("Can see true presence in the admin, despite privacy")),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.seen_at:%Y-%m-%d %H:%M:%S}"
