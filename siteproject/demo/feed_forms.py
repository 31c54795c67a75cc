"""Forms of the demo's activity feed pages."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from presence.feed.conf import get_settings


class PostForm(forms.Form):
    """Only the shape of the input; ``presence.feed.api.post`` checks the text (one rule)."""

    text = forms.CharField(
        label=_("What's new?"),
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "data-mention-input": ""}),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["text"].widget.attrs["maxlength"] = get_settings().ACTIVITY_MAX_LENGTH
