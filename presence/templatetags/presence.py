"""Template tags: thin wrappers over :mod:`presence.rendering`, which uses :mod:`presence.api`.

Each finds the request (the viewer is ``request.user``) with :func:`rendering.request_of`: the
``request`` variable, else the request the context carries, as the contexts of nested inclusion
tags do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import template
from django.template.loader import render_to_string
from django.utils.formats import number_format
from django.utils.safestring import SafeString

from presence import api, rendering
from presence.pages import menu

register = template.Library()


@register.simple_tag(takes_context=True)
def presence_prefetch(context: template.Context, targets: Any, path: str | None = None) -> str:
    """Load presence for many users at once, so the tags below cost nothing more. ``path``
    reads the users from objects that carry them: ``{% presence_prefetch comments "user" %}``,
    ``{% presence_prefetch posts "author.user" %}`` (dotted)."""
    rendering.prefetch(rendering.request_of(context), targets, path)
    return ""


@register.simple_tag(takes_context=True)
def presence_dot(context: template.Context, target: Any) -> SafeString:
    return rendering.dot(rendering.request_of(context), target)


@register.simple_tag(takes_context=True)
def last_seen(context: template.Context, target: Any) -> str:
    return rendering.last_seen_text(rendering.request_of(context), target)


class _StatusTextNode(template.Node):
    def __init__(self, target: template.base.FilterExpression, var: str | None):
        self.target, self.var = target, var

    def render(self, context: template.Context) -> str:
        request = rendering.request_of(context)
        target = self.target.resolve(context)
        if self.var is None:
            return rendering.status_text(request, target)
        # "as text": the text alone, rendered once, for markup of the site's own
        _, presence = rendering.presence_for(request, target)
        context[self.var] = rendering.custom_status(presence)
        return ""


@register.tag
def presence_text(parser: template.base.Parser, token: template.base.Token) -> _StatusTextNode:
    """A user's custom status (emoji and text), as the viewer may see it, in a
    ``<span class="presence-text">`` that presence.js keeps current (empty where nothing shows);
    ``{% presence_text user as text %}`` stores the text alone. Read with the dots (one read
    per page after ``presence_prefetch``)."""
    bits = token.split_contents()
    if len(bits) == 2:
        return _StatusTextNode(parser.compile_filter(bits[1]), None)
    if len(bits) == 4 and bits[2] == "as":
        return _StatusTextNode(parser.compile_filter(bits[1]), bits[3])
    raise template.TemplateSyntaxError(
        f"Use {{% {bits[0]} user %}} or {{% {bits[0]} user as name %}}."
    )


@register.simple_tag(takes_context=True)
def online_friends(context: template.Context, limit: int | None = None) -> list[Any]:
    return rendering.online_friends(rendering.request_of(context), limit)


@register.simple_tag(takes_context=True)
def online_friends_list(
    context: template.Context, limit: int = 20, template_name: str | None = None
) -> SafeString:
    """A live list of the viewer's online friends: rendered now, then kept current by
    presence.js (friends appear, reorder and disappear as their visible presence changes).
    ``template_name`` replaces presence/online_friends_list.html (keep its data attributes)."""
    request = rendering.request_of(context)
    data = rendering.live_friends(request, limit)
    return render_to_string(
        template_name or "presence/online_friends_list.html", data, request=request
    )


class _CountNode(template.Node):
    def __init__(self, count: Callable[[], int], html: Callable[[int], str], var: str | None):
        self.count, self.html, self.var = count, html, var

    def render(self, context: template.Context) -> str:
        count = self.count()
        if self.var is None:
            return self.html(count)
        # "as n": the number alone, in the page's language, for a sentence of the site's own
        context[self.var] = number_format(count, force_grouping=True)
        return ""


def _count_tag(
    parser: template.base.Parser,
    token: template.base.Token,
    count: Callable[[], int],
    html: Callable[[int], str],
) -> _CountNode:
    bits = token.split_contents()
    if len(bits) == 1:
        return _CountNode(count, html, None)
    if len(bits) == 3 and bits[1] == "as":
        return _CountNode(count, html, bits[2])
    raise template.TemplateSyntaxError(f"Use {{% {bits[0]} %}} or {{% {bits[0]} as name %}}.")


@register.tag
def online_count(parser: template.base.Parser, token: template.base.Token) -> _CountNode:
    """Users online now on the whole site (invisible users left out), as a number in the
    page's language ("1,234", "1.234") in a ``<span class="presence-online-count">`` that
    presence.js keeps live; ``{% online_count as n %}`` stores the number alone. Cheap enough
    for every page (api.online_count)."""
    return _count_tag(parser, token, api.online_count, rendering.online_count)


@register.tag
def guest_count(parser: template.base.Parser, token: template.base.Token) -> _CountNode:
    """Distinct anonymous visitors within ONLINE_WINDOW (``COUNT_GUESTS``; 0 otherwise), as a
    number in the page's language, rendered once; ``{% guest_count as n %}`` stores it."""
    return _count_tag(parser, token, api.guest_count, _plain_number)


def _plain_number(count: int) -> str:
    return number_format(count, force_grouping=True)


@register.simple_tag
def presence_css() -> SafeString:
    """The stylesheet of the dots (presence/presence.css); without it they measure 0 px."""
    return rendering.stylesheet_tag()


@register.simple_tag(takes_context=True)
def presence_script(context: template.Context, socket: str | None = None) -> SafeString:
    """presence.js and its configuration; ``socket=""`` makes it poll instead of a WebSocket.
    Carries the response's CSP nonce where the site has one (django-csp, Django's own).
    Nothing for an anonymous visitor: the socket and the endpoints answer logged-in users only."""
    request = rendering.request_of(context)
    return rendering.page_script(request, socket, rendering.csp_nonce(context))


@register.simple_tag(takes_context=True)
def room_presence(
    context: template.Context,
    room: Any,
    room_id: Any = None,
    meta: Any = None,
    template_name: str | None = None,
) -> SafeString:
    """Who is in the room now (``"post:42"``, or ``"post" post.pk``), kept live by presence.js;
    ``meta`` (a dict or its JSON) goes with this page's join. Nothing where the viewer may not
    see the room. ``template_name`` replaces presence/room_presence.html."""
    return rendering.room(rendering.request_of(context), room, room_id, meta, template_name)


@register.simple_tag(takes_context=True)
def prefetch_room_counts(context: template.Context, rooms: Any, ids: Any = None) -> str:
    """Read the counts of many rooms at once, so that each ``{% room_count %}`` of them costs
    nothing more: ``{% prefetch_room_counts "topic" topics %}`` (a kind, then ids or objects
    by their pk), or ``{% prefetch_room_counts names %}`` (``"kind:id"`` names)."""
    request = rendering.request_of(context)
    if ids is None:
        rendering.prefetch_room_counts(request, rooms)
    else:
        rendering.prefetch_room_counts(request, ids, kind=rooms)
    return ""


class _RoomCountNode(template.Node):
    def __init__(self, room: list[template.base.FilterExpression], var: str | None):
        self.room, self.var = room, var

    def render(self, context: template.Context) -> str:
        request = rendering.request_of(context)
        counted = rendering.room_count_of(request, *(part.resolve(context) for part in self.room))
        if self.var is None:
            return rendering.room_count(counted)
        # "as n": the number alone, in the page's language ("" where the room is not shown)
        context[self.var] = (
            "" if counted is None else number_format(counted[1], force_grouping=True)
        )
        return ""


@register.tag
def room_count(parser: template.base.Parser, token: template.base.Token) -> _RoomCountNode:
    """How many are in the room now as the viewer may see them (room_presence's count), in a
    ``<span class="presence-room-count">``: ``{% room_count "topic" topic.pk %}`` or
    ``{% room_count "topic:42" %}``; ``... as n`` stores the number alone (the page's
    snapshot). presence.js keeps the element live without joining the room; nothing where the
    viewer may not see the room. After ``{% prefetch_room_counts %}`` it costs nothing more."""
    bits = token.split_contents()
    var = None
    if len(bits) >= 4 and bits[-2] == "as":
        var, bits = bits[-1], bits[:-2]
    if len(bits) not in (2, 3):
        raise template.TemplateSyntaxError(
            f'Use {{% {bits[0]} "kind:id" %}} or {{% {bits[0]} "kind" id %}}'
            " (then as name, if you like)."
        )
    return _RoomCountNode([parser.compile_filter(bit) for bit in bits[1:]], var)


@register.simple_tag(takes_context=True)
def member_card(context: template.Context, target: Any) -> dict[str, Any] | None:
    """``{% member_card user as card %}``: how ``user`` is shown (MEMBER_CARD): ``card.name``,
    ``card.avatar`` (a URL or None) and ``card.initials``; once per user per request."""
    return rendering.card_of(rendering.request_of(context), target)


@register.simple_tag(takes_context=True)
def presence_status_menu(context: template.Context, template_name: str | None = None) -> SafeString:
    """The viewer's status (automatic, do not disturb, invisible, a text and emoji and when they
    clear) in a menu for a site's header, saved through presence.js, else by a plain POST to the
    settings page; nothing for an anonymous visitor. ``template_name`` replaces
    presence/status_menu.html."""
    request = rendering.request_of(context)
    return menu.status_menu(request, rendering.csp_nonce(context), template_name)
