"""The activity feed in the admin: groups with their members, activities with their mentions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count
from django.utils.translation import gettext_lazy as _

from presence.admin import UserFieldsMixin, user_search_fields
from presence.feed.models import Activity, Group, Membership, Mention


class MembershipInline(UserFieldsMixin, admin.TabularInline):
    model = Membership
    extra = 0
    user_fields = raw_id_fields = ("user",)
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


class MentionInline(UserFieldsMixin, admin.TabularInline):
    model = Mention
    extra = 0
    user_fields = raw_id_fields = ("user",)
    # The copy of the activity's time is set by presence.feed.api.post, and on save below.
    exclude = ("created_at",)


@admin.register(Activity)
class ActivityAdmin(UserFieldsMixin, admin.ModelAdmin):
    list_display = ("author", "short_text", "kind", "created_at")
    list_filter = ("kind",)
    search_fields = ("text", *user_search_fields("author"))
    user_fields = raw_id_fields = ("author",)
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
            # A mention added or pointed at another user here has no recorded places:
            # rendering finds its user's handle in the text (Mention.spans).
            mention.spans = None
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

    def save_related(self, request: Any, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        if change and "text" in form.changed_data:
            # The recorded places of the mentions are offsets into the old text.
            Mention.objects.filter(activity=form.instance).update(spans=None)
