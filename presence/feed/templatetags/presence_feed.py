"""Template filters of the activity feed: ``{% load presence_feed %}``."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString

from presence.feed import api as feed

register = template.Library()


@register.filter
def render_activity(activity: Any, url_name: str | None = None) -> SafeString:
    """``{{ activity|render_activity }}``: the text as HTML, escaped, with each mention linked
    (``{{ activity|render_activity:"accounts:profile" }}`` names the profile URL; without it,
    ``PRESENCE_FEED["MENTION_URL"]``, then the user's ``get_absolute_url()``)."""
    return feed.render_text(activity, url_name or None)
