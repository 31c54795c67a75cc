from __future__ import annotations

from contextvars import ContextVar
from functools import cache, partial
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.checks import InlineModelAdminChecks
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import ValidationError
from django.db.models import F, QuerySet
from django.forms.formsets import DELETION_FIELD_NAME
from django.forms.models import BaseInlineFormSet, inlineformset_factory
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from presence import api, domain, relations, resolution
from presence.api import live_user_ids
from presence.domain import UserId
from presence.models import (
    Block,
    Contact,
    LastSeen,
    PrivacyException,
    PrivacySettings,
    UserStatus,
)
from presence.store import StoreUnavailable, get_store
from presence.users import user_pk


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


class _ExceptionsOfTheUserChecks(InlineModelAdminChecks):
    # The inline's rows hang off the settings' user (PrivacySettings' pk), not a foreign key
    # to PrivacySettings itself: the formset is built on the user (PrivacyExceptionInline).
    def _check_relation(self, obj: Any, parent_model: Any) -> list[Any]:
        return []


#: why an exception naming its owner as the viewer is refused (the database refuses it too)
EXCEPTION_FOR_ONESELF = _("An exception is for someone else: the viewer cannot be the owner.")


class PrivacyExceptionForm(forms.ModelForm):
    """An exception whose viewer is its owner is a form error, not the database's CHECK
    constraint failing on save (the inline's rows carry no owner field of their own, so
    Django's model validation skips that constraint there)."""

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        owner, viewer = self.cleaned_data.get("owner"), self.cleaned_data.get("viewer")
        if owner is not None and viewer is not None and owner.pk == viewer.pk:
            self.add_error("viewer", EXCEPTION_FOR_ONESELF)
        return cleaned


class PrivacyExceptionFormSet(BaseInlineFormSet):
    """Django compares the page's rows with one another, and skips the database's unique
    constraint for an inline's rows (their owner is the page's): a new row repeating one of
    the owner's exceptions that the page does not show (an add page shows none) is refused
    here rather than by the database on save."""

    def clean(self) -> None:
        super().clean()
        if not self.instance._is_pk_set():
            return
        shown = [form.instance.pk for form in self.initial_forms]
        taken = set(
            PrivacyException.objects.filter(owner=self.instance)
            .exclude(pk__in=shown)
            .values_list("viewer_id", "setting")
        )
        for form in self.extra_forms:
            if not form.has_changed() or not form.is_valid():
                continue
            if form.cleaned_data.get(DELETION_FIELD_NAME):
                continue
            if (form.instance.viewer_id, form.instance.setting) in taken:
                fields = ("owner", "viewer", "setting")
                form.add_error(None, form.instance.unique_error_message(PrivacyException, fields))


class PrivacyExceptionInline(UserFieldsMixin, admin.TabularInline):
    """The user's "always share with" / "never share with" exceptions, on their privacy
    settings' page; saved like any row, so open sockets see the change at once."""

    model = PrivacyException
    form = PrivacyExceptionForm
    formset = PrivacyExceptionFormSet
    fk_name = "owner"
    checks_class = _ExceptionsOfTheUserChecks
    fields = ("viewer", "setting", "allow")
    user_fields = raw_id_fields = ("viewer",)
    extra = 1

    def get_formset(self, request: Any, obj: Any = None, **kwargs: Any) -> Any:
        return inlineformset_factory(
            get_user_model(),
            PrivacyException,
            form=self.form,
            formset=self.formset,
            fk_name="owner",
            fields=list(self.fields),
            extra=self.get_extra(request, obj),
            can_delete=self.can_delete,
            formfield_callback=partial(self.formfield_for_dbfield, request=request),
        )


@admin.register(PrivacyException)
class PrivacyExceptionAdmin(UserFieldsMixin, admin.ModelAdmin):
    form = PrivacyExceptionForm
    list_display = ("owner", "viewer", "setting", "allow")
    list_filter = ("setting", "allow")
    search_fields = user_search_fields("owner", "viewer")
    user_fields = raw_id_fields = ("owner", "viewer")
    list_select_related = ("owner", "viewer")


def _user_fixed_once_saved(readonly: Any, obj: Any) -> tuple[str, ...]:
    """``user`` is the row's primary key: changed on a change page, Django saves a copy under
    the new user and leaves the row as it was. Chosen on the add page only."""
    return (*readonly, "user") if obj is not None else tuple(readonly)


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
    inlines = (PrivacyExceptionInline,)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        return _user_fixed_once_saved(super().get_readonly_fields(request, obj), obj)

    def get_formset_kwargs(self, request: Any, obj: Any, inline: Any, prefix: str) -> Any:
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, PrivacyExceptionInline):
            # The exceptions belong to the settings' user (an unsaved user on an empty add page).
            user_id = getattr(obj, "user_id", None)
            if user_id is None and request.method == "POST":
                user_id = _posted_user_id(request)
            kwargs["instance"] = get_user_model()(pk=user_id) if user_id else None
            if user_id:
                kwargs["instance"]._state.adding = False
        return kwargs


def _posted_user_id(request: Any) -> Any:
    """The pk of the existing user an add page's form names, else None. The formsets are
    built before the page's form is validated: without it an add page's exceptions would have
    no owner to be checked against (oneself, a duplicate of one the user has) or saved with."""
    user_field = forms.ModelChoiceField(get_user_model()._default_manager.all())
    try:
        return user_field.clean(request.POST.get("user")).pk
    except ValidationError:
        return None  # the page's form says why


@admin.register(UserStatus)
class UserStatusAdmin(UserFieldsMixin, admin.ModelAdmin):
    list_display = ("user", "dnd", "emoji", "text", "activity", "expires_at", "updated_at")
    list_filter = ("dnd",)
    search_fields = (*USER_SEARCH, "text", "activity")
    user_fields = raw_id_fields = ("user",)

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        return _user_fixed_once_saved(super().get_readonly_fields(request, obj), obj)


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


# --- presence for moderators: dots, last seen, "online now" ------------------------------------

#: the permission that lets a moderator see true presence in the admin (and only there)
TRUE_PRESENCE_PERMISSION = f"{LastSeen._meta.app_label}.view_true_presence"

#: the presence of the users on the changelist page being rendered (as its viewer may see them)
_page_presence: ContextVar[dict[UserId, domain.Presence]] = ContextVar("presence_admin_page")


def sees_true_presence(request: Any) -> bool:
    """Whether the admin shows this moderator true presence: granted
    ``presence.view_true_presence`` (superusers have every permission). Privacy, blocks and
    invisibility then do not hide a user's status and last seen from them in the admin's
    columns, its "online now" filter and its sorting by last seen; everywhere else (the API,
    template tags, the JSON endpoint, the WebSocket) they see what privacy allows."""
    return bool(request.user.has_perm(TRUE_PRESENCE_PERMISSION))


def true_presence(targets: Any) -> dict[UserId, domain.Presence]:
    """Each target's presence as they see it themselves (the one resolver, as to themselves:
    their true status and last seen, and whether they are invisible), for
    :func:`sees_true_presence` moderators only. One query and one Redis round trip."""
    facts = relations.load(None, list(dict.fromkeys(map(user_pk, targets))))
    own = {pk: (domain.SELF, choices) for pk, (_, choices) in facts.items()}
    store = get_store()
    now = resolution.now()
    return resolution.resolve_all(own, store.run(store.plans.read(own)), now)


def _page_presences(request: Any, targets: list[Any]) -> dict[UserId, domain.Presence]:
    if sees_true_presence(request):
        return true_presence(targets)
    return api.bulk_presence(targets, request.user)


def _dot(presence: domain.Presence) -> SafeString:
    label: Any = domain.STATUS_LABELS[presence.status]
    if presence.invisible and presence.is_online:
        # True presence only (a moderator's): others see this user offline.
        label = format_html("{} ({})", label, _("invisible"))
    return format_html(
        '<span class="presence-dot presence-dot--{}" title="{}" aria-hidden="true"></span> {}',
        presence.status.value,
        label,
        label,
    )


#: what the dots of the admin's columns need (presence's template tags use the same sheet)
PRESENCE_MEDIA = forms.Media(css={"all": ("presence/presence.css",)})


#: the "online now" filter's warning while Redis cannot be reached
ONLINE_NOW_UNAVAILABLE = _(
    "Who is online now is unavailable: presence cannot reach Redis. No one is listed; "
    "try again later."
)


class OnlineNowFilter(admin.SimpleListFilter):
    """Users online now, as the moderator may see them (api.online_now: a scan of every
    bucket, O(users online)); every user online, invisible ones too, for a moderator granted
    ``presence.view_true_presence``."""

    title = _("presence")
    parameter_name = "online"
    #: the lookup from the listed model to the user's pk
    user_field = "pk"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, Any]]:
        return [("now", _("Online now"))]

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() != "now":
            return None
        try:
            online = (
                live_user_ids() if sees_true_presence(request) else api.online_now(request.user)
            )
        except StoreUnavailable:
            # A Redis outage never breaks a page: the list is empty, and says why.
            messages.warning(request, ONLINE_NOW_UNAVAILABLE, fail_silently=True)
            return queryset.none()
        return queryset.filter(**{f"{self.user_field}__in": online})


class PresenceColumnsMixin:
    """Changelist columns with each user's status dot and last seen (as the moderator may see
    them: the one privacy resolver; true presence for a moderator granted
    ``presence.view_true_presence``), read for the whole page at once. Loads presence's
    stylesheet (``presence/presence.css``) on the admin's pages, for the dots."""

    #: how to get the user's pk from a listed object
    presence_user_attr = "pk"

    @property
    def media(self) -> forms.Media:
        return super().media + PRESENCE_MEDIA  # type: ignore[misc]

    def get_changelist_instance(self, request: Any) -> Any:
        changelist = super().get_changelist_instance(request)  # type: ignore[misc]
        users = [getattr(row, self.presence_user_attr) for row in changelist.result_list]
        _page_presence.set(_page_presences(request, users))
        return changelist

    def _presence(self, obj: Any) -> domain.Presence:
        pk = getattr(obj, self.presence_user_attr)
        return _page_presence.get({}).get(pk, domain.HIDDEN)

    @admin.display(description=_("status"))
    def live_status(self, obj: Any) -> SafeString:
        return _dot(self._presence(obj))

    @admin.display(description=_("last seen"))
    def live_last_seen(self, obj: Any) -> str:
        return domain.humanize(self._presence(obj), timezone.now())


class PresenceUserAdminMixin(PresenceColumnsMixin):
    """For a site's own user admin (presence never re-registers it)::

        from django.contrib.auth.admin import UserAdmin
        from presence.admin import PresenceUserAdminMixin

        admin.site.unregister(User)

        @admin.register(User)
        class SiteUserAdmin(PresenceUserAdminMixin, UserAdmin):
            pass

    adds the status and last seen columns (sortable by last seen for staff who may view
    ``LastSeen`` or see true presence), an "online now" filter, and the privacy settings and
    last seen inlines on each user's page. Staff see what privacy lets them see, unless granted
    ``presence.view_true_presence`` (then true presence, in the admin only)."""

    def get_list_display(self, request: Any) -> tuple[Any, ...]:
        shown = tuple(super().get_list_display(request))  # type: ignore[misc]
        return (*shown, "live_status", "live_last_seen")

    def may_sort_by_last_seen(self, request: Any) -> bool:
        """Whether this moderator may order users by their true (persisted) last seen: only
        one who sees true presence (``presence.view_true_presence``) or may view ``LastSeen``
        rows, which show it anyway. For the others the column shows what the resolver lets
        them see, and an order by the true value would tell them what it hides."""
        if sees_true_presence(request):
            return True
        options = LastSeen._meta
        return any(
            request.user.has_perm(f"{options.app_label}.{get_permission_codename(action, options)}")
            for action in ("view", "change")
        )

    def get_sortable_by(self, request: Any) -> Any:
        sortable = super().get_sortable_by(request)  # type: ignore[misc]
        if self.may_sort_by_last_seen(request):
            return sortable
        return tuple(name for name in sortable if name != "live_last_seen")

    def get_changelist(self, request: Any, **kwargs: Any) -> Any:
        changelist = super().get_changelist(request, **kwargs)  # type: ignore[misc]
        if self.may_sort_by_last_seen(request):
            return changelist
        # sortable_by only hides the header's link: an ?o= naming the column would still sort.
        return _not_ordering_by(changelist, "live_last_seen")

    def get_list_filter(self, request: Any) -> tuple[Any, ...]:
        return (*super().get_list_filter(request), OnlineNowFilter)  # type: ignore[misc]

    def get_inlines(self, request: Any, obj: Any) -> list[Any]:
        inlines = list(super().get_inlines(request, obj))  # type: ignore[misc]
        return [*inlines, PrivacySettingsInline, LastSeenInline]

    # Never seen sorts as the oldest, on every database (PostgreSQL puts NULLs last by default).
    @admin.display(
        description=_("last seen"), ordering=F("presence_last_seen__seen_at").asc(nulls_first=True)
    )
    def live_last_seen(self, obj: Any) -> str:
        return super().live_last_seen(obj)


@cache
def _not_ordering_by(changelist: type[ChangeList], column: str) -> type[ChangeList]:
    """``changelist`` with ``column`` ordering nothing, whatever ``?o=`` asks."""

    class Unordered(changelist):  # type: ignore[valid-type,misc]
        def get_ordering_field(self, field_name: Any) -> Any:
            if field_name == column:
                return None
            return super().get_ordering_field(field_name)

    return Unordered


class _LastSeenOnlineNow(OnlineNowFilter):
    user_field = "user_id"


@admin.register(LastSeen)
class LastSeenAdmin(PresenceColumnsMixin, admin.ModelAdmin):
    presence_user_attr = "user_id"
    list_display = ("user", "seen_at", "live_status")
    list_filter = (_LastSeenOnlineNow,)
    search_fields = USER_SEARCH
    date_hierarchy = "seen_at"
    ordering = ("-seen_at",)
    # prior_seen_at too: presence keeps both (LastSeenManager.record_many), never the admin
    readonly_fields = ("user", "seen_at", "prior_seen_at")
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
    readonly_fields = ("seen_at", "prior_seen_at")
    verbose_name_plural = _("last seen")

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False
