"""What the template tags render, as plain functions (tested by exact HTML).

Presence read for a request is cached on the request, so a page showing 50 users costs one
query and one Redis round trip when it starts with ``{% presence_prefetch users %}`` (and at most
one each per user otherwise).
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import quote

from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist, ObjectDoesNotExist, PermissionDenied
from django.db import models
from django.template import TemplateSyntaxError
from django.template.loader import render_to_string
from django.templatetags.static import static
from django.urls import NoReverseMatch, get_script_prefix, reverse
from django.utils import timezone
from django.utils.formats import get_format, number_format
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from presence import api, domain, stamps
from presence.conf import get_settings
from presence.domain import InvalidInput, UserId
from presence.domain.display import script_words
from presence.domain.rooms import parse_room
from presence.rooms.counts import room_limit, visible_room_counts
from presence.rooms.rule import room_rule
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


def _request_cache(request: Any, attr: str) -> dict[Any, Any]:
    """The dict kept on ``request`` under ``attr`` (made on first use); a fresh one each time
    without a request: nothing to keep it on, so every read is fresh."""
    if request is None:
        return {}
    cache = getattr(request, attr, None)
    if cache is None:
        cache = {}
        setattr(request, attr, cache)
    return cache


def _cache(request: Any) -> dict[UserId, domain.Presence]:
    return _request_cache(request, _CACHE_ATTR)


def _pk(target: Any) -> UserId | None:
    """A user's pk from a user, an id, or an id's text (``"7"``, a UUID's text); None for
    anything else, an int outside the ids presence keeps included."""
    if isinstance(target, str):
        try:
            return parse_user_id(target)
        except ValueError:
            return None
    if isinstance(target, int) and not isinstance(target, bool):
        # The range parse_user_id allows the same id as text: beyond it the database refuses
        # the lookup (SQLite's OverflowError) where the id simply names no user.
        return target if 0 <= target <= domain.MAX_USER_ID else None
    try:
        return user_pk(target)
    except TypeError:
        return None


def prefetch(request: Any, targets: Any, path: str | None = None) -> None:
    """Read the presence of ``targets`` for this request at once (one query, one round trip).
    ``path`` (``"user"``, ``"author.user"``) reads the users from objects that carry them
    (:func:`carried_users`)."""
    cache = _cache(request)
    if path is not None:
        targets = carried_users(targets, path)
    ids = [pk for pk in map(_pk, targets or ()) if pk is not None and pk not in cache]
    if ids:
        stamps.note_read(request)
        found = api.bulk_presence(ids, _viewer(request))
        cache.update({pk: found.get(pk, domain.HIDDEN) for pk in ids})


def carried_users(objects: Any, path: str) -> list[Any]:
    """The users ``objects`` carry at the dotted attribute ``path`` (``"user"``,
    ``"author.user"``); an object whose path ends at None carries no user. For model instances
    whose path is made of foreign keys, the related objects not yet loaded are loaded first by
    ``prefetch_related_objects``: one query per step of the path whatever the number of
    objects, and the template's ``{{ comment.author.user }}`` then costs nothing.
    TemplateSyntaxError, naming the path, where an object has no such attribute."""
    parts = path.split(".") if isinstance(path, str) else []
    if not parts or not all(part.isidentifier() for part in parts):
        raise TemplateSyntaxError(
            f'presence_prefetch: {path!r} is not an attribute path (e.g. "user" or "author.user").'
        )
    items = list(objects or ())
    _load_relations(items, parts)
    user_model = get_user_model()
    found = []
    for item in items:
        value = item
        for step, part in enumerate(parts):
            if value is None:
                break
            try:
                value = getattr(value, part)
            except ObjectDoesNotExist:  # a reverse one-to-one with no row: no user
                value = None
            except AttributeError:
                raise TemplateSyntaxError(
                    f"presence_prefetch: {type(value).__name__} has no attribute {part!r} "
                    f"(path {path!r}, step {step + 1})."
                ) from None
        if isinstance(value, models.Model) and not isinstance(value, user_model):
            raise TemplateSyntaxError(
                f"presence_prefetch: the path {path!r} reaches a {type(value).__name__}, "
                f"not a user; name the user at its end (e.g. {path + '.user'!r})."
            )
        if value is not None:
            found.append(value)
    return found


def _load_relations(items: list[Any], parts: list[str]) -> None:
    """Load the objects along ``parts`` for model instances of one model, where every step is
    a forward relation (a foreign key, a one-to-one): the page reads them anyway."""
    if not items or not isinstance(items[0], models.Model):
        return
    model = type(items[0])
    if any(type(item) is not model for item in items):
        return
    for part in parts:
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            return  # an attribute, not a field: read as it is
        if not (field.many_to_one or field.one_to_one) or field.related_model is None:
            return
        model = field.related_model
    models.prefetch_related_objects(items, "__".join(parts))


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
    return dot_html(pk, presence.status, stamps.page_stamp(request))


def dot_html(pk: Any, status: domain.Status, stamp: str | None = None) -> SafeString:
    """A dot; ``stamp`` (the page's: presence.stamps.page_stamp) tells presence.js when its
    status was resolved, so that its socket is sent only what changed since (websocket.md)."""
    label = domain.STATUS_LABELS[status]
    return format_html(
        '<span class="presence-dot presence-dot--{}" data-presence-user="{}" '
        'title="{}" aria-label="{}" role="img"{}></span>',
        status.value,
        pk,
        label,
        label,
        format_html(' data-presence-since="{}"', stamp) if stamp else "",
    )


def custom_status(presence: domain.Presence) -> str:
    """A custom status as one text: its emoji, then its text, with a space between
    (``"🎧 Focus"``, ``"🎧"``, ``"Focus"``); empty where the viewer may see none (presence.js
    writes the same)."""
    return " ".join(part for part in (presence.emoji, presence.text) if part)


def status_text(request: Any, target: Any) -> SafeString:
    """``{% presence_text %}``: the custom status in an element presence.js keeps current,
    empty where nothing may be shown (hidden, blocked, expired, none), so that a status set
    later fills it; nothing for what names no user. It carries the page's stamp as the dots
    do: a custom status changed since then is sent to the page's socket."""
    pk, presence = presence_for(request, target)
    if pk is None:
        return SafeString("")
    return status_text_html(pk, custom_status(presence), stamps.page_stamp(request))


def status_text_html(pk: Any, text: str, stamp: str | None = None) -> SafeString:
    return format_html(
        '<span class="presence-text" data-presence-text="{}"{}>{}</span>',
        pk,
        format_html(' data-presence-since="{}"', stamp) if stamp else "",
        text,
    )


def last_seen_text(request: Any, target: Any) -> str:
    _, presence = presence_for(request, target)
    return domain.humanize(presence, timezone.now())


def online_friends(request: Any, limit: int | None) -> list[Any]:
    viewer = _viewer(request)
    if viewer is None or not viewer.is_authenticated:
        return []
    stamps.note_read(request)
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
    trips, whatever the number of friends. ``limit``: a non-negative int (else ValueError,
    as ``{% online_friends %}`` says)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a non-negative int, got {limit!r}.")
    viewer = _viewer(request)
    if viewer is None or not viewer.is_authenticated:
        return {"friends": [], "limit": limit, "shown_count": 0}
    stamps.note_read(request)
    online, others = api.watched_friends(viewer, MAX_FRIENDS_WATCHED)
    rows = [(friend, presence, index < limit) for index, (friend, presence) in enumerate(online)]
    rows += [(friend, presence, False) for friend, presence in others]
    # The dots of the list then show the very presence that placed them.
    _cache(request).update({friend.pk: presence for friend, presence, _ in rows})
    return {"friends": rows, "limit": limit, "shown_count": min(len(online), limit)}


def script_labels() -> dict[str, Any]:
    """The words presence.js puts on dots and last-seen texts, in the active language, and
    how the page writes numbers."""
    labels: dict[str, Any] = {
        status.value: str(label) for status, label in domain.STATUS_LABELS.items()
    }
    labels["onlineText"] = gettext("online")
    labels["justNow"] = gettext("just now")
    # "last seen recently"... by last_seen_approx (presence.js shows no number, no time)
    labels.update(
        {approx.value: str(label) for approx, label in domain.LAST_SEEN_APPROX_LABELS.items()}
    )
    # "5 minutes ago": the words humanize() writes, for presence.js to write the same.
    labels.update(script_words())
    # The online count as {% online_count %} writes it (number_format): presence.js groups
    # its digits the same way.
    labels["numberGrouping"] = get_format("NUMBER_GROUPING")
    labels["thousandSeparator"] = get_format("THOUSAND_SEPARATOR")
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


def script_tag(
    socket: str | None = None, nonce: str | None = None, viewer_id: Any = None
) -> SafeString:
    """The ``<script>`` of presence.js with what it needs as data attributes (README
    "Template tags"). ``socket`` overrides the WebSocket path; ``""`` leaves the socket out,
    and the client polls the JSON endpoint instead. ``nonce`` (a CSP nonce) is rendered as the
    tag's ``nonce`` attribute, for policies such as ``script-src 'self' 'nonce-…'``.
    ``viewer_id``, the logged-in user's pk, is ``presence.self`` in the page: a room's members
    always list the viewer, and a page's script leaves them out by it (a typing indicator)."""
    conf = get_settings()
    if socket is None:
        socket = get_script_prefix() + SOCKET_PATH
    return format_html(
        '<script src="{}" data-presence-endpoint="{}" data-presence-status-endpoint="{}"{} '
        'data-presence-heartbeat="{}" data-presence-idle-after="{}" data-presence-labels="{}"{} '
        "defer{}></script>",
        static("presence/presence.js"),
        reverse("presence:presence"),
        reverse("presence:status"),
        format_html(' data-presence-socket="{}"', socket) if socket else "",
        conf.HEARTBEAT_INTERVAL,
        conf.IDLE_AFTER,
        json.dumps(script_labels(), ensure_ascii=False, separators=(",", ":")),
        # (spelt as the status menu's data-presence-self and the rooms' member keys)
        format_html(' data-presence-self="{}"', viewer_id) if viewer_id is not None else "",
        format_html(' nonce="{}"', nonce) if nonce else "",
    )


def page_script(request: Any, socket: str | None = None, nonce: str | None = None) -> SafeString:
    """What ``{% presence_script %}`` renders for this request: :func:`script_tag`, with the
    user's id, or nothing for a visitor who is not logged in. The WebSocket and the JSON
    endpoints answer logged-in users only, so for an anonymous visitor the client could only
    open a socket that is refused (4401) and stop. With no request to tell (a template rendered
    without one) the script is rendered, without an id: the client then finds out by itself."""
    user = getattr(request, "user", None)
    if user is not None and not user.is_authenticated:
        return SafeString("")
    return script_tag(socket, nonce, None if user is None else str(user.pk))


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


#: a name reverse() leaves as it is, to find where the room's name goes in the endpoint's path
_ROOM_MARKER = "room:0"


def room_endpoint(name: str) -> str:
    """The path of the room's JSON endpoint (``presence:room``), its name percent-encoded, "/"
    included (docs/http.md, "Rooms"): one path segment, which a browser fetches as it is. With
    its slashes left as they are (reverse() does), it would resolve the name's "." and ".."
    segments first and ask for another room ("page:a/./b" as "page:a/b") or none at all. The
    one segment is never a dot segment: it holds the kind's ":". The server decodes it back."""
    marker_url = reverse("presence:room", args=[_ROOM_MARKER])
    return marker_url[: -len(_ROOM_MARKER)] + quote(name, safe=":@")


def room(
    request: Any,
    room: Any,
    room_id: Any = None,
    meta: Any = None,
    template_name: str | None = None,
) -> SafeString:
    """Who is in the room now, as the viewer may see it (presence.js then joins it and keeps
    it live); nothing for an anonymous viewer or a room the viewer may not see: a refused, an
    undeclared or a malformed room renders as no room at all. ``template_name`` replaces
    presence/room_presence.html (keep its data attributes and classes)."""
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
    members = [room_member(key, member) for key, member in state["members"].items()]
    context = {
        "room": name,
        "endpoint": room_endpoint(name),
        # The viewer's own name: their join lists them, and presence.js need not ask for it.
        "viewer_id": viewer.pk,
        "viewer_name": _card(request, viewer)["name"],
        "meta": meta,
        "members": members,
        "others": state["others"],
        "count": state["count"],
        "count_html": format_html("<span data-presence-room-count>{}</span>", state["count"]),
    }
    html = render_to_string(template_name or "presence/room_presence.html", context, request)
    return SafeString(html)


# --- rooms' counts ({% room_count %}) --------------------------------------------------------

_ROOM_COUNTS_ATTR = "_presence_room_counts"


def _room_counts_cache(request: Any) -> dict[str, int | None]:
    """Each room's count read for this request (None: the viewer may not see the room)."""
    return _request_cache(request, _ROOM_COUNTS_ATTR)


def _room_names(rooms: Any, kind: str | None) -> list[str]:
    """The rooms' names: ``rooms`` names them, or, with ``kind``, holds their ids (or objects,
    by their pk); the malformed and undeclared left out (the tags show them as nothing)."""
    names = []
    for room in rooms or ():
        if kind is not None:
            room = room_name(kind, getattr(room, "pk", room))
        try:
            parsed = parse_room(room)
            room_rule(parsed)
        except (InvalidInput, api.UnknownRoom):
            continue
        names.append(parsed.name)
    return names


def prefetch_room_counts(request: Any, rooms: Any, kind: str | None = None) -> None:
    """Read the counts of ``rooms`` for this request at once (:func:`_room_names`), so that
    each ``{% room_count %}`` of them costs nothing more: one trip to the database and one
    Redis round trip per ROOM_LIST_LIMIT rooms."""
    viewer = _viewer(request)
    if viewer is None or not viewer.is_authenticated:
        return
    cache = _room_counts_cache(request)
    names = [name for name in dict.fromkeys(_room_names(rooms, kind)) if name not in cache]
    limit = room_limit()
    for start in range(0, len(names), limit):
        cache.update(visible_room_counts(names[start : start + limit], viewer))


def room_count_of(request: Any, room: Any, room_id: Any = None) -> tuple[str, int] | None:
    """The room's name and count as the viewer may see it (room_presence's count), from what
    :func:`prefetch_room_counts` read, else read now; None for an anonymous viewer, or a room
    the viewer may not see (refused, undeclared or malformed)."""
    viewer = _viewer(request)
    if viewer is None or not viewer.is_authenticated:
        return None
    names = _room_names([room_name(room, room_id)], None)
    if not names:
        return None
    cache = _room_counts_cache(request)
    if names[0] not in cache:
        cache.update(visible_room_counts(names, viewer))
    count = cache[names[0]]
    return None if count is None else (names[0], count)


def room_count(counted: tuple[str, int] | None) -> SafeString:
    """``{% room_count %}``: the count in the page's language, in an element presence.js keeps
    live without joining the room (watch_room_count over the socket, else a poll of the
    counts endpoint its attribute names, as many rooms a request as the endpoint takes:
    ROOM_LIST_LIMIT, its other attribute); nothing where the viewer may not see the room."""
    if counted is None:
        return SafeString("")
    name, count = counted
    try:
        endpoint = reverse("presence:room_counts")
    except NoReverseMatch:  # a site without presence's URLs: live over the socket only
        endpoint = ""
    return format_html(
        '<span class="presence-room-count" data-presence-room-count-of="{}"'
        ' data-presence-room-counts-endpoint="{}" data-presence-room-counts-limit="{}">{}</span>',
        name,
        endpoint,
        room_limit(),
        number_format(count, force_grouping=True),
    )


def initials(name: str) -> str:
    """The avatar's letters: the first of the name's first two words, or the first two of a
    one-word name (presence.js's rule)."""
    words = name.split()
    letters = words[0][:2] if len(words) == 1 else "".join(word[:1] for word in words[:2])
    return letters.upper()


def display_card(card: dict[str, Any]) -> dict[str, Any]:
    """A card as templates show it: its ``name``, ``avatar`` (a URL or None) and ``initials``
    (shown where there is no avatar)."""
    return {**card, "initials": initials(card["name"])}


def room_member(key: str, member: dict[str, Any]) -> dict[str, Any]:
    """One listed member as presence/room_presence.html shows it: its key, card (with
    initials), status and dot (presence.js builds the same markup for arrivals)."""
    status = domain.Status((member.get("presence") or {}).get("status", "offline"))
    return {
        "key": key,
        "card": display_card(member["card"]),
        "status": status.value,
        "meta": member.get("meta"),
        "dot": dot_html(key, status),
    }


# --- cards ({% member_card %}, the friends list) ------------------------------------------------

_CARDS_ATTR = "_presence_cards"


def _card_cache(request: Any) -> dict[Any, dict[str, Any]]:
    return _request_cache(request, _CARDS_ATTR)


def _card(request: Any, user: Any) -> dict[str, Any]:
    """``user``'s card for display, computed once per request (MEMBER_CARD)."""
    cache = _card_cache(request)
    if user.pk not in cache:
        cache[user.pk] = display_card(api.member_card(user))
    return cache[user.pk]


def card_of(request: Any, target: Any) -> dict[str, Any] | None:
    """The card of a user (or a user's id) for display: ``name``, ``avatar``, ``initials``;
    None for anything that names no user. An id costs a query once per request."""
    if hasattr(target, "get_username"):
        return _card(request, target)
    pk = _pk(target)
    if pk is None:
        return None
    cache = _card_cache(request)
    if pk not in cache:
        user = get_user_model()._default_manager.filter(pk__in=[pk]).first()
        if user is None:
            return None
        cache[pk] = display_card(api.member_card(user))
    return cache[pk]
