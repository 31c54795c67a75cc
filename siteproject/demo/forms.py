from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from presence.models import PRIVACY_EXCEPTION_SETTINGS, PrivacyException, PrivacySettings


class PrivacyForm(forms.ModelForm):
    class Meta:
        model = PrivacySettings
        fields = ["online_visibility", "last_seen_visibility", "activity_visibility", "invisible"]
        widgets = {
            "online_visibility": forms.RadioSelect,
            "last_seen_visibility": forms.RadioSelect,
            "activity_visibility": forms.RadioSelect,
        }
        help_texts = {
            "online_visibility": _("“My contacts” are the people you follow."),
            "last_seen_visibility": _(
                "Only people who may also see when you are online see your last seen."
            ),
            "activity_visibility": _("Your status text and emoji."),
            "invisible": _("Look offline to everyone, with no last seen, while using the site."),
        }


STATUS_CHOICES = [
    ("auto", _("Automatic — online while you are active")),
    ("dnd", _("Do not disturb")),
    ("invisible", _("Invisible — appear offline")),
]

#: choice -> seconds until the custom status clears; "today" and "never" are computed
EXPIRY_SECONDS = {"30m": 30 * 60, "1h": 3600, "4h": 4 * 3600}
EXPIRY_CHOICES = [
    ("30m", _("in 30 minutes")),
    ("1h", _("in 1 hour")),
    ("4h", _("in 4 hours")),
    ("today", _("at midnight")),
    ("never", _("never")),
]


class StatusForm(forms.Form):
    """Only the shape of the input; ``presence.api.set_status`` checks the values (one rule)."""

    status = forms.ChoiceField(label=_("Status"), choices=STATUS_CHOICES, widget=forms.RadioSelect)
    emoji = forms.CharField(label=_("Emoji"), required=False, strip=True)
    text = forms.CharField(label=_("What's happening?"), required=False, strip=True)
    expires = forms.ChoiceField(label=_("Clear status"), choices=EXPIRY_CHOICES, initial="never")

    def expires_at(self, now: datetime | None = None) -> datetime | None:
        now = now or timezone.now()
        choice = self.cleaned_data["expires"]
        if choice == "never":
            return None
        if choice == "today":
            local = timezone.localtime(now)
            midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
            return midnight + timedelta(days=1)
        return now + timedelta(seconds=EXPIRY_SECONDS[choice])


class SharingForm(forms.Form):
    """'Always share with' / 'Never share with' pickers for each privacy setting, as messengers
    have them; saved through presence.api.share_with/unshare (open sockets update at once)."""

    def __init__(self, *args: Any, owner: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner
        people = get_user_model()._default_manager.exclude(pk=owner.pk).order_by("username")
        current = PrivacyException.objects.filter(owner=owner)
        for setting, label in PRIVACY_EXCEPTION_SETTINGS:
            for allow, word in ((True, _("Always share with")), (False, _("Never share with"))):
                self.fields[self.name(setting, allow)] = forms.ModelMultipleChoiceField(
                    queryset=people,
                    required=False,
                    label=format_lazy("{}: {}", label, word),
                    initial=[
                        row.viewer_id
                        for row in current
                        if row.setting == setting and row.allow == allow
                    ],
                    widget=forms.SelectMultiple(attrs={"size": 4}),
                )

    @staticmethod
    def name(setting: str, allow: bool) -> str:
        return f"{'always' if allow else 'never'}_{setting}"

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for setting, label in PRIVACY_EXCEPTION_SETTINGS:
            both = set(data.get(self.name(setting, True)) or ()) & set(
                data.get(self.name(setting, False)) or ()
            )
            if both:
                names = ", ".join(sorted(user.get_username() for user in both))
                self.add_error(
                    self.name(setting, False),
                    _("%(names)s cannot be in both lists of “%(setting)s”: remove them from one.")
                    % {"names": names, "setting": label},
                )
        return data

    def save(self) -> None:
        from presence import api

        wanted: dict[tuple[Any, str], bool] = {}
        for setting, _label in PRIVACY_EXCEPTION_SETTINGS:
            for allow in (True, False):
                for user in self.cleaned_data[self.name(setting, allow)]:
                    wanted[user.pk, setting] = allow
        for row in PrivacyException.objects.filter(owner=self.owner):
            if (row.viewer_id, row.setting) not in wanted:
                api.unshare(self.owner, row.viewer_id, row.setting)
        for (viewer, setting), allow in wanted.items():
            api.share_with(self.owner, viewer, setting, allow)
