from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.utils.translation import gettext_lazy as _

from presence.models import (
    Block,
    Contact,
    LastSeen,
    PrivacySettings,
    UserStatus,
)


def user_search_fields(*relations: str) -> tuple[str, ...]:
    """Search fields for users through ``relations`` (e.g. "user"), from the site's user model:
    its USERNAME_FIELD and EMAIL_FIELD, and first/last name where it has them. A model that
    logs in by e-mail has no "username" to search."""
    user_model = get_user_model()
    concrete = {field.name for field in user_model._meta.concrete_fields}
    email = getattr(user_model, "get_email_field_name", lambda: "email")()
    wanted = (user_model.USERNAME_FIELD, email, "first_name", "last_name")
    fields = [name for name in dict.fromkeys(wanted) if name in concrete]
    return tuple(f"{relation}__{name}" for relation in relations for name in fields)


def user_admin_searchable() -> bool:
    """Whether the site's user model has an admin with search fields: what autocomplete widgets
    for users need (else Django's check admin.E039/E040 would fail every manage.py command)."""
    user_model = get_user_model()
    if not admin.site.is_registered(user_model):
        return False
    return bool(admin.site.get_model_admin(user_model).search_fields)


class UserFieldsMixin:
    """Foreign keys to users as autocomplete widgets where the site's user admin allows it,
    else as raw id inputs: presence never makes a site's checks fail."""

    #: the foreign keys to the user model
    user_fields: tuple[str, ...] = ()

    def get_autocomplete_fields(self, request: Any) -> tuple[str, ...]:
        return self.user_fields if user_admin_searchable() else ()


USER_SEARCH = user_search_fields("user")


@admin.register(PrivacySettings)
class PrivacySettingsAdmin(UserFieldsMixin, admin.ModelAdmin):
    list_display = (
        "user",
        "online_visibility",
        "last_seen_visibility",
        "activity_visibility",
        "invisible",
    )
    list_filter = ("online_visibility", "last_seen_visibility", "activity_visibility", "invisible")
    search_fields = USER_SEARCH
    user_fields = raw_id_fields = ("user",)


@admin.register(UserStatus)
class UserStatusAdmin(UserFieldsMixin, admin.ModelAdmin):
    list_display = ("user", "dnd", "emoji", "text", "activity", "expires_at", "updated_at")
    list_filter = ("dnd",)
    search_fields = (*USER_SEARCH, "text", "activity")
    user_fields = raw_id_fields = ("user",)


@admin.register(Contact)
class ContactAdmin(UserFieldsMixin, admin.ModelAdmin):
    list_display = ("owner", "contact", "close_friend", "created_at")
    list_filter = ("close_friend",)
    search_fields = user_search_fields("owner", "contact")
    user_fields = raw_id_fields = ("owner", "contact")
    list_select_related = ("owner", "contact")


@admin.register(Block)
class BlockAdmin(UserFieldsMixin, admin.ModelAdmin):
    list_display = ("blocker", "blocked", "created_at")
    search_fields = user_search_fields("blocker", "blocked")
    user_fields = raw_id_fields = ("blocker", "blocked")
    list_select_related = ("blocker", "blocked")


@admin.register(LastSeen)
class LastSeenAdmin(admin.ModelAdmin):
    list_display = ("user", "seen_at")
    search_fields = USER_SEARCH
    date_hierarchy = "seen_at"
    ordering = ("-seen_at",)
    readonly_fields = ("user", "seen_at")
    list_select_related = ("user",)

    def has_add_permission(self, request: Any) -> bool:
        return False


class PrivacySettingsInline(admin.StackedInline):
    model = PrivacySettings
    can_delete = False
    verbose_name = verbose_name_plural = _("presence privacy")


class LastSeenInline(admin.TabularInline):
    model = LastSeen
    can_delete = False
    readonly_fields = ("seen_at",)
    verbose_name_plural = _("last seen")

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


def _extend_user_admin() -> None:
    """Put privacy settings and last seen on the site's own User admin page."""
    user_model = get_user_model()
    if not admin.site.is_registered(user_model):
        return
    base = type(admin.site.get_model_admin(user_model))
    if PrivacySettingsInline in getattr(base, "inlines", ()):
        return
    extended = type(
        base.__name__,
        (base,),
        {"inlines": [*base.inlines, PrivacySettingsInline, LastSeenInline]},
    )
    admin.site.unregister(user_model)
    admin.site.register(user_model, extended)


_extend_user_admin()
