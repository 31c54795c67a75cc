"""JSON endpoints. Every answer is JSON, errors included: 400 for bad input, 401 for anonymous
callers (never a redirect to a login page), 403 for a failed CSRF check, 405 for a wrong method.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import (
    REASON_CSRF_TOKEN_MISSING,
    REASON_NO_CSRF_COOKIE,
    CsrfViewMiddleware,
)
from django.utils.cache import add_never_cache_headers, patch_cache_control
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.csrf import csrf_exempt

from presence import api, domain, ratelimit, resolution, users
from presence.api import COUNT_INTERVAL
from presence.conf import get_settings
from presence.domain import InvalidInput, UserId
from presence.domain.nesting import nests_too_deeply
from presence.domain.rooms import parse_room
from presence.rooms import room_state
from presence.rooms.counts import distinct_rooms, polled_room_counts
from presence.rooms.paging import room_page_state
from presence.store import StoreUnavailable

MAX_IDS = 500
MAX_BODY_BYTES = 4096

View = Callable[..., HttpResponse]


def error(code: str, message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def refusal(
    request: HttpRequest, methods: tuple[str, ...], login_message: str
) -> HttpResponse | None:
    """The JSON answer refusing a request before its view runs: 405 for another method, 401
    for an anonymous caller (never a redirect to a login page); None to go on."""
    if request.method not in methods:
        response: HttpResponse = error(
            "method_not_allowed",
            _("Use %(methods)s.") % {"methods": ", ".join(methods)},
            status=405,
        )
        response["Allow"] = ", ".join(methods)
        return response
    if not request.user.is_authenticated:
        return error("not_authenticated", login_message, status=401)
    return None


def _json_view(*methods: str) -> Callable[[View], View]:
    """Allow only ``methods`` (405 as JSON otherwise), require a login (401 as JSON), and keep
    answers out of shared caches: they depend on who asks."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            response = refusal(request, methods, _("Log in to see presence.")) or view(
                request, *args, **kwargs
            )
            add_never_cache_headers(response)
            return response

        return wrapper

    return decorate


#: Django's own CSRF check (the middleware's public process_view); it answers a request it
#: refuses with the site's CSRF_FAILURE_VIEW, which the endpoints answer in JSON instead
_csrf_check = CsrfViewMiddleware(lambda request: HttpResponse())


def _csrf_reason(request: HttpRequest) -> str:
    """Why Django refused the request, as far as the request tells (in Django's words)."""
    if not settings.CSRF_USE_SESSIONS and settings.CSRF_COOKIE_NAME not in request.COOKIES:
        return REASON_NO_CSRF_COOKIE
    if settings.CSRF_HEADER_NAME not in request.META:
        return REASON_CSRF_TOKEN_MISSING
    return "CSRF token incorrect, or the origin or referer is not trusted."


def csrf_rejection(request: HttpRequest) -> HttpResponse | None:
    """Django's CSRF check answered in JSON (403), or None when the request passes. A request
    authenticated by a token header (presence.tokens) carries no cookie: no other site can make
    a browser send it, so it needs no CSRF token."""
    if getattr(request, "presence_token_auth", False):
        return None
    refused = _csrf_check.process_view(request, None, (), {})  # type: ignore[arg-type]
    if refused is None:
        return None
    message = _("CSRF verification failed: %(reason)s") % {"reason": _csrf_reason(request)}
    return error("csrf_failed", message, status=403)


def parse_user_ids(raw: str | None) -> list[UserId]:
    """Comma-separated ids as the site spells its pks (``1,2,3``; UUIDs as
    ``0b6f...-...``): the pks, or InvalidInput naming the first that cannot be one."""
    parts = [part.strip() for part in (raw or "").split(",") if part.strip()]
    if not parts:
        raise InvalidInput("missing_users", _("Pass user ids as ?users=1,2,3."))
    if len(parts) > MAX_IDS:
        raise InvalidInput(
            "too_many_users",
            _("At most %(max)d ids per request; got %(count)d.")
            % {"max": MAX_IDS, "count": len(parts)},
        )
    kind = users.pk_kind()
    ids: list[UserId] = []
    for part in parts:
        try:
            ids.append(users.parse_user_id(part, kind))
        except ValueError:
            raise InvalidInput(
                "invalid_users", _("%(value)s is not a user id.") % {"value": repr(part[:40])}
            ) from None
    return ids


def over_read_limit(request: HttpRequest, ids: int) -> HttpResponse | None:
    """Count a read of ``ids`` distinct ids by the caller (``HTTP_READ_LIMIT``, shared by every
    process): None when allowed, else the 429 answering it, with ``Retry-After``."""
    wait = ratelimit.read_retry_after(request.user, ids)
    if wait is None:
        return None
    message = ngettext(
        "Too many presence reads in a short time; try again in %(seconds)d second.",
        "Too many presence reads in a short time; try again in %(seconds)d seconds.",
        wait,
    ) % {"seconds": wait}
    return _too_many(message, wait)


def _too_many(message: str, wait: int) -> HttpResponse:
    """The 429 of a limit: ``rate_limited``, with ``Retry-After`` in whole seconds."""
    response = error("rate_limited", message, status=429)
    response["Retry-After"] = str(wait)
    return response


@csrf_exempt  # GET only: another method is answered 405 in JSON, not by Django's HTML 403 page
@_json_view("GET")
def presence_view(request: HttpRequest) -> HttpResponse:
    """``GET ?users=1,2,3``: ``{"presences": {"1": {...}}}`` (keys in the canonical form: a
    UUID lowercase with hyphens); ids of no user are left out."""
    try:
        ids = parse_user_ids(request.GET.get("users"))
    except InvalidInput as exc:
        return error(exc.code, exc.message)
    refused = over_read_limit(request, len(set(ids)))
    if refused is not None:
        return refused
    presences = api.bulk_presence(ids, request.user)
    return JsonResponse(
        {"presences": {str(pk): presence.as_dict() for pk, presence in presences.items()}}
    )


@csrf_exempt  # GET only: another method is answered 405 in JSON, not by Django's HTML 403 page
def online_count_view(request: HttpRequest) -> HttpResponse:
    """``GET online_count``: ``{"count": N}``, users online now on the whole site (invisible
    ones left out), for anyone, logged in or not: presence.js polls it where it has no socket.
    Answered from this process's reading of the last COUNT_INTERVAL (5 s), so any number of
    callers cost Redis one ``ZCOUNT`` per process per interval; shared caches may keep it as
    long."""
    if request.method != "GET":
        response: HttpResponse = error(
            "method_not_allowed", _("Use %(methods)s.") % {"methods": "GET"}, status=405
        )
        response["Allow"] = "GET"
        return response
    response = JsonResponse({"count": api.recent_online_count()})
    patch_cache_control(response, public=True, max_age=int(COUNT_INTERVAL))
    return response


def _body_length(request: HttpRequest) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None


def json_body(request: HttpRequest, limit: int) -> tuple[Any, HttpResponse | None]:
    """The parsed JSON body of a CSRF-checked POST, or the JSON error answering it."""
    # Refuse a large body before reading it; read it before the CSRF check parses a form body
    # (reading request.body after a multipart request.POST would raise).
    length = _body_length(request)
    if length is None or length > limit or len(request.body) > limit:
        return None, error(
            "payload_too_large",
            _("The body must be at most %(max)d bytes.") % {"max": limit},
        )
    rejected = csrf_rejection(request)
    if rejected is not None:
        return None, rejected
    # Deep nesting is measured first: json's RecursionError comes at other depths on other Pythons.
    try:
        if nests_too_deeply(request.body):
            raise ValueError("nested too deeply")
        return json.loads(request.body), None
    except (ValueError, RecursionError):
        return None, error("invalid_json", _("The body is not valid JSON."))


def over_rate_limit(request: HttpRequest) -> HttpResponse | None:
    """Count one HTTP write of the caller (``HTTP_RATE_LIMIT``, shared by every process): None
    when allowed, else the 429 answering it, with ``Retry-After``."""
    wait = ratelimit.retry_after(request.user)
    if wait is None:
        return None
    return _too_many(ratelimit.limited_message(wait), wait)


@csrf_exempt  # checked below, after the login check, so failures are answered in JSON
@_json_view("POST")
def status_view(request: HttpRequest) -> HttpResponse:
    """``POST`` a JSON object with the fields of the WebSocket ``set_status`` message; answers
    ``{"presence": {...}}``, the caller's own presence (with ``invisible``)."""
    data, refused = json_body(request, MAX_BODY_BYTES)
    if refused is not None:
        return refused
    try:
        change = domain.parse_status_change(data, resolution.limits())
    except InvalidInput as exc:
        return error(exc.code, exc.message)  # (saves nothing: not a write to count)
    refused = over_rate_limit(request)
    if refused is not None:
        return refused
    presence = api.apply_change(request.user, change)
    return JsonResponse({"presence": presence.as_dict()})


@csrf_exempt  # GET only: another method is answered 405 in JSON, not by Django's HTML 403 page
@_json_view("GET")
def room_view(request: HttpRequest, room: str) -> HttpResponse:
    """``GET rooms/<room>``: ``{"room", "members", "others", "count", "next"}`` as the caller
    may see it, each listed member with its ``name``; with ``?after=CURSOR`` (the ``next`` of an
    earlier answer), the members after it (docs/rooms.md, "Paging"). 400 for a malformed name
    or a cursor this server did not give for the room, 404 for a kind the site did not
    declare, 403 where the room's rule refuses, 503 while presence's Redis cannot be read (an
    outage: the room is not shown empty). A read or a page counts against ``HTTP_READ_LIMIT``
    as the most members it may list (``ROOM_LIST_LIMIT``)."""
    try:
        parse_room(room)
    except InvalidInput as exc:
        return error(exc.code, exc.message)
    refused = over_read_limit(request, get_settings().ROOM_LIST_LIMIT)
    if refused is not None:
        return refused
    after = request.GET.get("after")
    try:
        if after is not None:
            # The next page after a cursor of an earlier answer (docs/rooms.md, "Paging").
            state = room_page_state(room, request.user, after).as_dict()
        else:
            # Strict: a room Redis could not read is not shown empty (nobody here would be false).
            state = room_state(room, request.user, strict=True).as_dict()
    except InvalidInput as exc:
        return error(exc.code, exc.message)
    except api.UnknownRoom as exc:
        return error(exc.code, exc.message, status=404)
    except PermissionDenied:
        return error("forbidden", _("You may not see who is in this room."), status=403)
    except StoreUnavailable:
        return room_unavailable()
    return JsonResponse({"room": room, **api.with_names(state)})


@csrf_exempt  # GET only: another method is answered 405 in JSON, not by Django's HTML 403 page
@_json_view("GET")
def room_counts_view(request: HttpRequest) -> HttpResponse:
    """``GET room_counts?room=topic:7&room=topic:8``: ``{"counts": {"topic:7": 3, ...}}``, each
    room's count as the caller may see it (``room_counts``: what ``{% room_count %}`` shows
    and ``watch_room_count`` sends), the cheap read a page polls without a socket. At most
    ROOM_LIST_LIMIT rooms; 400 for none, too many or a malformed name (before anything is
    read); a room the caller may not see (its rule refuses, or a kind the site does not
    declare) is null, as the tag shows it as nothing, not a refusal of the whole batch (a page
    polls all its counts at once); 503 while presence's Redis cannot be read. Counts against
    ``HTTP_READ_LIMIT`` as one id per room (a count lists no member)."""
    asked = request.GET.getlist("room")
    if not asked:
        return error("missing_rooms", _("Name the rooms as ?room=kind:id&room=kind:id."))
    try:
        # Malformed names and too many rooms first: bad input costs nothing.
        names = distinct_rooms(asked)
    except InvalidInput as exc:
        return error(exc.code, exc.message)
    refused = over_read_limit(request, len(names))
    if refused is not None:
        return refused
    try:
        counts = polled_room_counts(names, request.user)
    except StoreUnavailable:
        return room_unavailable()
    return JsonResponse({"counts": counts})


def room_unavailable() -> HttpResponse:
    """503 ``unavailable``: presence's Redis could not be read (an outage), so who is in the
    room is unknown; ``Retry-After`` is when presence tries Redis again (RETRY_INTERVAL)."""
    response = error(
        "unavailable",
        _("Who is in this room cannot be read right now; try again shortly."),
        status=503,
    )
    response["Retry-After"] = str(max(1, math.ceil(get_settings().RETRY_INTERVAL)))
    return response
