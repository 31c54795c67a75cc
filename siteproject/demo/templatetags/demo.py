"""Small helpers of the demo's templates: avatars as colored initials."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

#: avatar colours: site.css has .avatar--hue-0 ... .avatar--hue-11
HUES = 12


def initials(user: Any) -> str:
    first, last = (user.first_name or "").strip(), (user.last_name or "").strip()
    if first or last:
        return (first[:1] + last[:1]).upper()
    return user.get_username()[:2].upper()


@register.simple_tag
def avatar(user: Any, size: str = "md") -> SafeString:
    # A stable hue per user, so people keep their color across pages: one of HUES classes
    # (site.css), since the Content Security Policy allows no inline style.
    return format_html(
        '<span class="avatar avatar--{} avatar--hue-{}" aria-hidden="true">{}</span>',
        size,
        (int(user.pk) * 7) % HUES,
        initials(user),
    )


@register.filter
def display_name(user: Any) -> str:
    return user.get_full_name() or user.get_username()
