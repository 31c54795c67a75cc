from __future__ import annotations

from datetime import datetime, timedelta

from django import forms
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

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
