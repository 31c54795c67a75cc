"""The forms of the settings page: the three privacy levels, and the status (automatic, do not
disturb or invisible) with a custom text and emoji that may clear at a chosen time. The
per-person exceptions are :mod:`presence.pages.sharing`.

Every check is made here, before anything is saved; saving goes through the paths the admin
and the API take (a saved PrivacySettings row, ``api.set_status``), so open sockets are told
at once."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.utils import formats, timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from presence import api, domain, resolution
from presence.domain import VISIBILITY_SETTINGS, InvalidInput
from presence.models import PrivacySettings, UserStatus


def _shown_values(data: Any, initial: dict[str, Any]) -> dict[str, Any]:
    """``initial`` with what the page showed where the post says so (``initial-<name>``): a
    change is measured against it, not against the rows when the page is posted."""
    shown = dict(initial)
    if data is not None:
        for name in shown:
            value = data.get(f"initial-{name}")
            if isinstance(value, str):
                shown[name] = value
    return shown


def _shown_inputs(form: forms.BaseForm) -> SafeString:
    """The hidden inputs that post back what the page showed (``initial-<name>``): one for each
    field, the values the page was first rendered with (kept when it is shown again with
    errors)."""
    return format_html_join(
        "",
        '<input type="hidden" name="{}" value="{}">',
        (
            (form[name].html_initial_name, form.get_initial_for_field(field, name))
            for name, field in form.fields.items()
        ),
    )


class LevelsForm(forms.ModelForm):
    """Who sees when the user is online, their last seen, their custom status.

    A change is measured against what the page showed, which it posts back in hidden inputs
    (:meth:`shown_inputs`, ``initial-online_visibility``...), not against the row when it is
    posted: a level changed meanwhile elsewhere (another tab, the admin, the API) is kept unless
    this page changed it. A form posted without them (an older page, a site's own template) is
    measured against the row."""

    class Meta:
        model = PrivacySettings
        fields = list(VISIBILITY_SETTINGS)
        widgets = {name: forms.RadioSelect for name in VISIBILITY_SETTINGS}
        help_texts = {
            "online_visibility": _(
                "“My contacts” are the people you added to your contacts; “Close friends” "
                "are the contacts you marked as close friends."
            ),
            "last_seen_visibility": _(
                "When you were last active. Others may still see roughly how long ago "
                "(“recently”, “within a week”)."
            ),
            "activity_visibility": _("Your status text and emoji."),
        }

    def __init__(self, data: Any = None, *, instance: PrivacySettings) -> None:
        #: the levels as stored now (the site's defaults for a user without a row)
        self.stored = {name: getattr(instance, name) for name in VISIBILITY_SETTINGS}
        super().__init__(data, instance=instance, initial=_shown_values(data, self.stored))
        for field in self.fields.values():
            # The fields' defaults are callables, for which Django would add a hidden initial
            # input of its own (a post without it counting as a change): shown_inputs posts
            # what the page showed instead.
            field.show_hidden_initial = False

    def shown_inputs(self) -> SafeString:
        return _shown_inputs(self)

    def save_levels(self) -> bool:
        """Save the levels changed on the page, and only them (``invisible`` is the status
        form's); the others keep what they are now. A user without a row gets one only when a
        level differs from the site's defaults. True if anything was saved."""
        changed = {
            name: self.cleaned_data[name]
            for name in self.changed_data
            # (changed on the page to what is stored now: nothing to save)
            if self.cleaned_data[name] != self.stored[name]
        }
        if not changed:
            return False
        # A saved row (update_or_create saves through the model) tells open sockets; it writes
        # only these levels.
        PrivacySettings.objects.update_or_create(user_id=self.instance.user_id, defaults=changed)
        return True


STATUS_CHOICES = [
    ("auto", _("Automatic — online while you are active")),
    ("dnd", _("Do not disturb")),
    ("invisible", _("Invisible — appear offline to everyone")),
]
#: choice -> seconds until the custom status clears ("today": until the next local midnight)
EXPIRY_SECONDS = {"30m": 30 * 60, "1h": 3600, "4h": 4 * 3600}
EXPIRY_CHOICES = [
    ("30m", _("in 30 minutes")),
    ("1h", _("in 1 hour")),
    ("4h", _("in 4 hours")),
    ("today", _("at midnight")),
    ("never", _("never")),
]
KEEP = "keep"
#: the fields of the custom status, saved together
CUSTOM_FIELDS = ("text", "emoji", "expires")


def next_midnight(now: datetime) -> datetime:
    """The next midnight in the active time zone: 23 or 25 hours away on a day the clocks
    change, not always 24."""
    local = timezone.localtime(now)
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    # Wall-clock arithmetic in the zone: the next day's 00:00, whatever the offset then.
    return midnight + timedelta(days=1)


def _live_custom(row: UserStatus | None, now: datetime) -> UserStatus | None:
    """The row, if its custom status has not cleared yet."""
    if row is None or (row.expires_at is not None and row.expires_at <= now):
        return None
    return row


_STATUS_FIELDS = ("dnd", "text", "emoji", "activity", "expires_at")


def _own_status(user: Any) -> tuple[UserStatus | None, bool]:
    """The user's status row (None without one) and whether they are invisible, in one query:
    the status menu reads them on every page it is on."""
    columns = [f"presence_status__{name}" for name in ("user", *_STATUS_FIELDS)]
    found = (
        get_user_model()
        ._default_manager.filter(pk=user.pk)
        .values(*columns, "presence_privacy__invisible")
        .first()
    )
    if found is None:
        return None, False
    invisible = bool(found["presence_privacy__invisible"])
    if found["presence_status__user"] is None:
        return None, invisible
    values = {name: found[f"presence_status__{name}"] for name in _STATUS_FIELDS}
    return UserStatus(user_id=user.pk, **values), invisible


class StatusForm(forms.Form):
    """The user's status and custom status; saved with ``api.set_status`` when it changed.

    A change is measured against what the page showed, which it posts back in hidden inputs
    (:meth:`shown_inputs`, ``initial-status``...), not against the rows when it is posted: a
    status saved meanwhile elsewhere (the status menu on the same page, another tab) is kept
    unless this page changed that part of it. The mode (automatic, do not disturb, invisible)
    is one part, the custom status (text, emoji and when they clear) the other. A form posted
    without them (a site's own template) is measured against the rows."""

    status = forms.ChoiceField(
        label=_("Show me as"), choices=STATUS_CHOICES, widget=forms.RadioSelect
    )
    emoji = forms.CharField(label=_("Emoji"), required=False)
    text = forms.CharField(label=_("Status text"), required=False)
    expires = forms.ChoiceField(label=_("Clear the text and emoji"))

    def __init__(
        self,
        data: Any = None,
        *,
        user: Any,
        now: datetime | None = None,
        auto_id: str = "id_%s",
    ) -> None:
        """``auto_id``: the ids of its inputs, other than the settings page's where it is shown
        beside that page's form (the status menu in a site's header)."""
        self.user = user
        self.now = now or timezone.now()
        row, invisible = _own_status(user)
        custom = _live_custom(row, self.now)
        self.activity = custom.activity if custom else ""
        self.current_expiry = custom.expires_at if custom else None
        #: the user's status as stored now
        self.stored = {
            "status": "invisible" if invisible else "dnd" if row and row.dnd else "auto",
            "text": custom.text if custom else "",
            "emoji": custom.emoji if custom else "",
            "expires": KEEP if self.current_expiry else "never",
        }
        super().__init__(data, initial=_shown_values(data, self.stored), auto_id=auto_id)
        limits = resolution.limits()
        for name, limit in (("text", limits.text_max_length), ("emoji", limits.emoji_max_length)):
            self.fields[name] = forms.CharField(
                label=self.fields[name].label, required=False, max_length=limit
            )
        self.fields["text"].help_text = _("Up to %(max)d characters.") % {
            "max": limits.text_max_length
        }
        expires = self.fields["expires"]
        assert isinstance(expires, forms.ChoiceField)
        expires.choices = self._expiry_choices(limits.max_expiry)

    def _expiry_choices(self, max_expiry: int) -> list[tuple[str, Any]]:
        choices: list[tuple[str, Any]] = []
        if self.current_expiry is not None:
            when = formats.date_format(timezone.localtime(self.current_expiry), "DATETIME_FORMAT")
            choices.append((KEEP, _("as set: %(when)s") % {"when": when}))
        # Only what the site allows (MAX_STATUS_EXPIRY), midnight by the time really left until it.
        choices += [
            (value, label)
            for value, label in EXPIRY_CHOICES
            if value == "never" or self._seconds_left(value) <= max_expiry
        ]
        return choices

    def _seconds_left(self, choice: str) -> float:
        when = self.clears(choice)
        assert when is not None
        return (when if isinstance(when, timedelta) else when - self.now).total_seconds()

    def _clean_text(self, name: str) -> str:
        value: str = self.cleaned_data[name]
        try:
            return domain.check_text(value, name)
        except InvalidInput as error:
            raise forms.ValidationError(error.message, code=error.code) from None

    def clean_text(self) -> str:
        return self._clean_text("text")

    def clean_emoji(self) -> str:
        return self._clean_text("emoji")

    def shown_inputs(self) -> SafeString:
        """The hidden inputs that post back what the page showed (``initial-status``...): one
        for each field, the values the page was first rendered with (kept when it is shown
        again with errors)."""
        return _shown_inputs(self)

    def custom_changed(self) -> bool:
        """Whether the custom status (text, emoji, when they clear) differs from what the page
        showed: then it is saved as posted; else it is kept as stored."""
        return any(name in self.changed_data for name in CUSTOM_FIELDS)

    def clean_expires(self) -> str:
        choice: str = self.cleaned_data["expires"]
        passed = self.current_expiry is None or self.current_expiry <= self.now
        # (a custom status kept as stored keeps its time, whatever the page showed)
        if choice == KEEP and passed and self.custom_changed():
            raise forms.ValidationError(_("That time has passed: choose when to clear again."))
        return choice

    def clears(self, choice: str) -> timedelta | datetime | None:
        """When the custom status clears with ``choice``: a span from its save ("in 1 hour"), a
        time ("at midnight", as set), or None (never). The status menu's script reads these
        (presence.pages.menu), so a save through presence.js clears when this form's would."""
        if choice == KEEP:
            return self.current_expiry
        if choice == "never":
            return None
        if choice == "today":
            return next_midnight(self.now)
        return timedelta(seconds=EXPIRY_SECONDS[choice])

    def expires_at(self) -> datetime | None:
        when = self.clears(self.cleaned_data["expires"])
        return self.now + when if isinstance(when, timedelta) else when

    def save_status(self) -> bool:
        """``api.set_status`` with the parts that changed from what the page showed (the mode,
        the custom status), the other part as stored (the user's activity, which this page
        does not edit, is kept). True if anything was saved. Raises InvalidInput as
        ``set_status`` does (the view shows it on the form)."""
        if not self.has_changed():
            return False
        data = self.cleaned_data
        status = data["status"] if "status" in self.changed_data else self.stored["status"]
        activity = self.activity
        if self.custom_changed():
            text, emoji, expires_at = data["text"], data["emoji"], self.expires_at()
        else:
            text, emoji, expires_at = self.stored["text"], self.stored["emoji"], self.current_expiry
            if expires_at is not None and expires_at - timezone.now() < timedelta(seconds=1):
                # clearing this very moment (set_status takes no time that close): cleared
                text = emoji = activity = ""
                expires_at = None
        api.set_status(
            self.user,
            status,
            text=text or None,
            emoji=emoji or None,
            activity=activity or None,
            expires_at=expires_at,
        )
        return True
