from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.utils import formats, timezone
from django.utils.translation import gettext_lazy as _

from presence.models import UserStatus

STATUS_CHOICES = [
    ("auto", _("Automatic — online while you are active")),
    ("dnd", _("Do not disturb")),
    ("invisible", _("Invisible — appear offline")),
]

#: choice -> seconds until the custom status clears; "today" and "never" are computed
EXPIRY_SECONDS = {"30m": 30 * 60, "1h": 3600, "4h": 4 * 3600}
#: the choice that keeps when the custom status clears now
KEEP = "keep"
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

    def __init__(self, *args: Any, current_expiry: datetime | None = None, **kwargs: Any) -> None:
        """``current_expiry``: when the user's custom status clears now (:func:`current_expiry`),
        offered first and chosen, so that saving a new status (auto to dnd) keeps it."""
        super().__init__(*args, **kwargs)
        self.current_expiry = current_expiry
        if current_expiry is not None:
            when = formats.date_format(timezone.localtime(current_expiry), "DATETIME_FORMAT")
            expires = self.fields["expires"]
            assert isinstance(expires, forms.ChoiceField)
            expires.choices = [(KEEP, _("as set: %(when)s") % {"when": when}), *EXPIRY_CHOICES]
            expires.initial = KEEP

    def expires_at(self, now: datetime | None = None) -> datetime | None:
        now = now or timezone.now()
        choice = self.cleaned_data["expires"]
        if choice == KEEP:
            keep = self.current_expiry
            return keep if keep is not None and keep > now else None
        if choice == "never":
            return None
        if choice == "today":
            local = timezone.localtime(now)
            midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
            return midnight + timedelta(days=1)
        return now + timedelta(seconds=EXPIRY_SECONDS[choice])


def current_expiry(user: Any, now: datetime | None = None) -> datetime | None:
    """When ``user``'s custom status clears, if it has one that has not cleared yet."""
    now = now or timezone.now()
    expires_at = (
        UserStatus.objects.filter(user=user, expires_at__gt=now)
        .values_list("expires_at", flat=True)
        .first()
    )
    return expires_at
