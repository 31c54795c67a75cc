"""The site's nested inclusion tags (issue 29): link_user inside news_item inside
item_control. link_user takes the context, as presence's old warning advised, but hands on no
request: what it returns is all its template's context holds."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("hn/item_control.html")
def item_control(story: Any) -> dict[str, Any]:
    return {"story": story}


@register.inclusion_tag("hn/news_item.html")
def news_item(story: Any) -> dict[str, Any]:
    return {"story": story}


@register.inclusion_tag("hn/link_user.html", takes_context=True)
def link_user(context: template.Context, user: Any) -> dict[str, Any]:
    return {"user": user}
