"""What the template tags render, as plain functions (tested by exact HTML).

Presence read for a request is cached on the request, so a page showing 50 users costs one
query and one Redis round trip when it starts with ``{% presence_prefetch users %}`` (and at most
one each per user otherwise).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import PermissionDenied
from django.templatetags.static import static
from django.urls import NoReverseMatch, get_script_prefix, reverse
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from presence import api, domain
from presence.conf import get_settings
from presence.domain import InvalidInput, UserId
from presence.users import parse_user_id, user_pk

logger = logging.getLogger("presence")

_CACHE_ATTR = "_presence_cache"
#: whether this process already said that a tag rendered without a request (DEBUG only)
_warned_without_request = False


def request_of(context: Any) -> Any:
    """The request a template is rendered for, wherever Django keeps it: the ``request``
    variable (the ``request`` context processor), else the ``request`` attribute of the context.
    Django's ``RequestContext`` carries that attribute (``render(request, ...)``,
    ``render_to_string(..., request=request)``), and so does every context it makes for an
    inclusion tag (``Context.new`` copies the context, attribute included, at any depth), though
    those contexts hold only the variables the tag returned. None for a template rendered
    without a request."""
    if context is None:
        return None
    request = context.get("request")
    if request is None:
        request = getattr(context, "request", None)
    return request


def _viewer(request: Any) -> Any:
    if request is None:
        _warn_without_request()
    return getattr(request, "user", None)


def _warn_without_request() -> None:
    """In DEBUG, say once per process that a tag rendered with no ``request`` in its context:
    it then shows presence as a stranger sees it, quietly different from the rest of the page."""
    global _warned_without_request
    if django_settings.DEBUG and not _warned_without_request:
        _warned_without_request = True
        logger.warning(
            "Presence: a template tag rendered without `request` in its context, so it shows "
            "presence as a stranger sees it. Render the page with its request (render(request, "
            "...), render_to_string(..., request=request)) and enable the context processor "
            "'django.template.context_processors.request' (presence.W004)."
        )


def _cache(request: Any) -> dict[UserId, domain.Presence]:
    if request is None:
        return {}  # nothing to keep it on: every read is fresh
    cache = getattr(request, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        setattr(request, _CACHE_ATTR, cache)
    return cache


def _pk(target: Any) -> UserId | None:
    """A user's pk from a user, an id, or an id's text (``"7"``, a UUID's text); None for
    anything else."""
    if isinstance(target, str):
        try:
            return parse_user_id(target)
        except ValueError:
            return None
    try:
        return user_pk(target)
    except TypeError:
        return None


def prefetch(request: Any, targets: Any) -> None:
    """Read the presence of ``targets`` for this request at once (one query, one round trip)."""
    cache = _cache(request)
    ids = [pk for pk in map(_pk, targets or ()) if pk is not None and pk not in cache]
    if ids:
        found = api.bulk_presence(ids, _viewer(request))
        cache.update({pk: found.get(pk, domain.HIDDEN) for pk in ids})


def presence_for(request: Any, target: Any) -> tuple[UserId | None, domain.Presence]:
    pk = _pk(target)
    if pk is None:
        return None, domain.HIDDEN
    if request is None:  # no request to cache on (a template rendered outside a request)
        return pk, api.get_presence(pk, _viewer(request))
    cache = _cache(request)
    if pk not in cache:
        prefetch(request, [pk])
    return pk, cache[pk]


def dot(request: Any, target: Any) -> SafeString:
    pk, presence = presence_for(request, target)
    if pk is None:
        return SafeString("")
    return dot_html(pk, presence.status)


def dot_html(pk: Any, status: domain.Status) -> SafeString:
    label = domain.STATUS_LABELS[status]
    return format_html(
        '<span class="presence-dot presence-dot--{}" data-presence-user="{}" '
        'title="{}" aria-label="{}" role="img"></span>',
        status.value,
        pk,
        label,
        label,
    )


def last_seen_text(request: Any, target: Any) -> str:
    _, presence = presence_for(request, target)
    return domain.humanize(presence, timezone.now())


def online_friends(request: Any, limit: int | None) -> list[Any]:
    viewer = _viewer(request)
    if viewer is None or not viewer.is_authenticated:
        return []
    found = api.online_friends_with_presence(viewer, limit)
    # The dots of these friends then show the very presence that listed them.
    _cache(request).update({friend.pk: presence for friend, presence in found})
    return [friend for friend, _ in found]


#: friends a live online-friends list watches at most: the online ones first, then the others
#: as the viewer may see them (a friend beyond it who comes online shows on the next page load)
MAX_FRIENDS_WATCHED = 200


def live_friends(request: Any, limit: int) -> dict[str, Any]:
    """The context of a live online-friends list: the viewer's friends it watches, each with
    the presence the viewer may see and whether it is shown now (online, within ``limit``),
    in the order of :func:`presence.api.watched_friends`. Three queries and two Redis round
    trips, whatever the number of friends."""
    viewer = _viewer(request)
    if viewer is None or not viewer.is_authenticated:
        return {"friends": [], "limit": limit, "shown_count": 0}
    online, others = api.watched_friends(viewer, MAX_FRIENDS_WATCHED)
    rows = [(friend, presence, index < limit) for index, (friend, presence) in enumerate(online)]
    rows += [(friend, presence, False) for friend, presence in others]
    # The dots of the list then show the very presence that placed them.
    _cache(request).update({friend.pk: presence for friend, presence, _ in rows})
    return {"friends": rows, "limit": limit, "shown_count": min(len(online), limit)}


def script_labels() -> dict[str, str]:
    """The words presence.js puts on dots and last-seen texts, in the active language."""
    labels = {status.value: str(label) for status, label in domain.STATUS_LABELS.items()}
    labels["onlineText"] = gettext("online")
    labels["justNow"] = gettext("just now")
    # "last seen recently"... by last_seen_approx (presence.js shows no number, no time)
    labels.update(
        {approx.value: str(label) for approx, label in domain.LAST_SEEN_APPROX_LABELS.items()}
    )
    return labels


#: where ``presence.routing.websocket_urlpatterns`` serves the consumer (docs/websocket.md)
SOCKET_PATH = "ws/presence/"


def stylesheet_tag() -> SafeString:
    """The ``<link>`` of presence.css, which gives the dots their size and colours."""
    return format_html('<link rel="stylesheet" href="{}">', static("presence/presence.css"))


def csp_nonce(context: Any) -> str | None:
    """The Content Security Policy nonce of this response, if the site uses one: Django's own
    (the ``csp`` context processor's ``csp_nonce``) or django-csp's ``request.csp_nonce``."""
    if context is None:
        return None
    nonce = context.get("csp_nonce")
    if nonce is None:
        # django-csp's lazy nonce is falsy until read: read it (that also puts it in the header).
        nonce = getattr(request_of(context), "csp_nonce", None)
    text = str(nonce) if nonce is not None else ""
    return text or None


def script_tag(socket: str | None = None, nonce: str | None = None) -> SafeString:
    """The ``<script>`` of presence.js with what it needs as data attributes (README
    "Template tags"). ``socket`` overrides the WebSocket path; ``""`` leaves the socket out,
    and the client polls the JSON endpoint instead. ``nonce`` (a CSP nonce) is rendered as the
    tag's ``nonce`` attribute, for policies such as ``script-src 'self' 'nonce-…'``."""
    conf = get_settings()
    if socket is None:
        socket = get_script_prefix() + SOCKET_PATH
    return format_html(
        '<script src="{}" data-presence-endpoint="{}" data-presence-status-endpoint="{}"{} '
        'data-presence-heartbeat="{}" data-presence-idle-after="{}" data-presence-labels="{}" '
        "defer{}></script>",
        static("presence/presence.js"),
        reverse("presence:presence"),
        reverse("presence:status"),
        format_html(' data-presence-socket="{}"', socket) if socket else "",
        conf.HEARTBEAT_INTERVAL,
        conf.IDLE_AFTER,
        json.dumps(script_labels(), ensure_ascii=False, separators=(",", ":")),
        format_html(' nonce="{}"', nonce) if nonce else "",
    )


def page_script(request: Any, socket: str | None = None, nonce: str | None = None) -> SafeString:
    """What ``{% presence_script %}`` renders for this request: :func:`script_tag`, or nothing
    for a visitor who is not logged in. The WebSocket and the JSON endpoints answer logged-in
    users only, so for an anonymous visitor the client could only open a socket that is refused
    (4401) and stop. With no request to tell (a template rendered without one) the script is
    rendered: the client then finds out by itself."""
    user = getattr(request, "user", None)
    if user is not None and not user.is_authenticated:
        return SafeString("")
    return script_tag(socket, nonce)


def online_count(count: int) -> SafeString:
    """``{% online_count %}``: the number in the page's language, in an element presence.js
    keeps live (its attribute names the JSON endpoint it polls where it has no socket)."""
    try:
        endpoint = reverse("presence:online_count")
    except NoReverseMatch:  # a site without presence's URLs: live over the socket only
        endpoint = ""
    return format_html(
        '<span class="presence-online-count" data-presence-online-count="{}">{}</span>',
        endpoint,
        number_format(count, force_grouping=True),
    )


# --- rooms ({% room_presence %}) --------------------------------------------------------------


def room_name(room: Any, room_id: Any = None) -> str:
    """``"post:42"`` from ``"post:42"``, or from the kind and the id (``"post"``, ``42``)."""
    return str(room) if room_id is None else f"{room}:{room_id}"


def room(request: Any, room: Any, room_id: Any = None, meta: Any = None) -> SafeString:
    """Who is in the room now, as the viewer may see it (presence.js then joins it and keeps
    it live); nothing for an anonymous viewer or a room the viewer may not see: a refused, an
    undeclared or a malformed room renders as no room at all."""
    viewer = _viewer(request)
    if viewer is None or not viewer.is_authenticated:
        return SafeString("")
    name = room_name(room, room_id)
    try:
        state = api.with_names(api.room_presence(name, viewer))
    except (InvalidInput, PermissionDenied, api.UnknownRoom):
        return SafeString("")
    if meta is not None and not isinstance(meta, str):
        meta = json.dumps(meta, ensure_ascii=False, separators=(",", ":"))
    members = (room_member(key, member) for key, member in state["members"].items())
    others = state["others"]
    count_text = escape(gettext("Here now: %(count)s")) % {
        "count": format_html("<span data-presence-room-count>{}</span>", state["count"])
    }
    return format_html(
        '<div class="presence-room" data-presence-room="{}" data-presence-room-endpoint="{}" '
        'data-presence-room-viewer="{}" data-presence-room-viewer-name="{}"{}>'
        '<ul class="presence-room__members" data-presence-room-members>{}</ul>'
        '<span class="presence-room__others" data-presence-room-others title="{}"{}>+{}</span>'
        '<span class="presence-room__count">{}</span></div>',
        name,
        reverse("presence:room", args=[name]),
        # The viewer's own name: their join lists them, and presence.js need not ask for it.
        viewer.pk,
        api.display_name(viewer),
        format_html(' data-presence-room-meta="{}"', meta) if meta is not None else "",
        SafeString("".join(members)),
        gettext("More people are here"),
        "" if others else SafeString(" hidden"),
        others,
        SafeString(count_text),
    )


def initials(name: str) -> str:
    """The avatar's letters: the first of the name's first two words, or the first two of a
    one-word name (presence.js's rule)."""
    words = name.split()
    letters = words[0][:2] if len(words) == 1 else "".join(word[:1] for word in words[:2])
    return letters.upper()


def room_member(key: str, member: dict[str, Any]) -> SafeString:
    """One listed member: avatar, dot and name (presence.js builds the same for arrivals)."""
    status = domain.Status((member.get("presence") or {}).get("status", "offline"))
    return format_html(
        '<li class="presence-room__member" data-presence-room-member="{}">'
        '<span class="presence-room__avatar" aria-hidden="true">{}</span>{} '
        '<span class="presence-room__name">{}</span></li>',
        key,
        initials(member["name"]),
        dot_html(key, status),
        member["name"],
    )
