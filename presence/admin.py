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

USER_SEARCH = ("user__username", "user__email", "user__first_name", "user__last_name")


@admin.register(PrivacySettings)
class PrivacySettingsAdmin(admin.ModelAdmin):
    list_display = (
        "user",
        "online_visibility",
        "last_seen_visibility",
        "activity_visibility",
        "invisible",
    )
    list_filter = ("online_visibility", "last_seen_visibility", "activity_visibility", "invisible")
    search_fields = USER_SEARCH
    autocomplete_fields = ("user",)


@admin.register(UserStatus)
class UserStatusAdmin(admin.ModelAdmin):
    list_display = ("user", "dnd", "emoji", "text", "activity", "expires_at", "updated_at")
    list_filter = ("dnd",)
    search_fields = (*USER_SEARCH, "text", "activity")
    autocomplete_fields = ("user",)


@admin.register(Contact)
class ContactAdmin(admin.ModelAdmin):
    list_display = ("owner", "contact", "close_friend", "created_at")
    list_filter = ("close_friend",)
    search_fields = ("owner__username", "owner__email", "contact__username", "contact__email")
    autocomplete_fields = ("owner", "contact")
    list_select_related = ("owner", "contact")


@admin.register(Block)
class BlockAdmin(admin.ModelAdmin):
    list_display = ("blocker", "blocked", "created_at")
    search_fields = ("blocker__username", "blocker__email", "blocked__username", "blocked__email")
    autocomplete_fields = ("blocker", "blocked")
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
