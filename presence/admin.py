from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Count
from django.utils.translation import gettext_lazy as _

from presence.models import (
    Activity,
    Block,
    Contact,
    Group,
    LastSeen,
    Membership,
    Mention,
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


# --- activity feed ------------------------------------------------------------------------------


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)
    readonly_fields = ("joined_at",)


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "member_count", "created_at")
    search_fields = ("name", "slug", "description")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]

    def get_queryset(self, request: Any) -> Any:
        return super().get_queryset(request).annotate(_members=Count("memberships"))

    @admin.display(description=_("members"), ordering="_members")
    def member_count(self, group: Any) -> int:
        return int(group._members)


class MentionInline(admin.TabularInline):
    model = Mention
    extra = 0
    autocomplete_fields = ("user",)
    # The copy of the activity's time is set by presence.feed.post, and on save below.
    exclude = ("created_at",)


@admin.register(Activity)
class ActivityAdmin(admin.ModelAdmin):
    list_display = ("author", "short_text", "kind", "created_at")
    list_filter = ("kind",)
    search_fields = ("text", "author__username", "author__email")
    autocomplete_fields = ("author",)
    list_select_related = ("author",)
    # Newest first through the (created_at, id) index, however large the table; no
    # date_hierarchy (its year list reads every row) and no second count when searching.
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    inlines = [MentionInline]

    @admin.display(description=_("text"))
    def short_text(self, activity: Activity) -> str:
        return activity.text if len(activity.text) <= 80 else activity.text[:79] + "…"

    def save_formset(self, request: Any, form: Any, formset: Any, change: bool) -> None:
        mentions = formset.save(commit=False)
        for mention in mentions:
            mention.created_at = formset.instance.created_at
            mention.save()
        for deleted in formset.deleted_objects:
            deleted.delete()
        formset.save_m2m()

    def save_model(self, request: Any, obj: Activity, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        # The mentions timeline pages by the mention's copy of the activity's time.
        Mention.objects.filter(activity=obj).exclude(created_at=obj.created_at).update(
            created_at=obj.created_at
        )
