"""JSON endpoints of the activity feed, in the style of :mod:`presence.views`: every answer is
JSON, errors included (400 bad input, 401 anonymous, 403 CSRF, 404 unknown group or user, 405
wrong method), and nothing is cached by shared caches.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt

from presence.domain import InvalidInput, check_text
from presence.feed import api as feed
from presence.feed import domain as feed_domain
from presence.feed.conf import get_settings
from presence.feed.models import Group
from presence.users import parse_user_id
from presence.views import csrf_rejection, error, json_body, over_rate_limit, refusal

#: what a group's slug may hold (Django's slug converter's characters)
SLUG = re.compile(r"[-a-zA-Z0-9_]+")
#: most users one mention-completion answer lists
MAX_SUGGESTIONS = 10
#: longest prefix accepted for mention completion
MAX_PREFIX = 150

FeedView = Callable[..., HttpResponse]


def _feed_view(*methods: str, csrf: bool = False) -> Callable[[FeedView], FeedView]:
    """Allow only ``methods`` (405 otherwise), require a login (401), check CSRF after the
    login check when ``csrf`` (so failures are answered in JSON), turn InvalidInput into 400."""

    def decorate(view: FeedView) -> FeedView:
        @csrf_exempt  # checked below when asked, after the login check
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            refused = refusal(request, methods, _("Log in to see the feed.")) or (
                csrf_rejection(request) if csrf else None
            )
            if refused is not None:
                response = refused
            else:
                try:
                    response = view(request, *args, **kwargs)
                except InvalidInput as exc:
                    response = error(exc.code, exc.message)
            add_never_cache_headers(response)
            return response

        return wrapper

    return decorate


def _cursor(request: HttpRequest) -> str | None:
    return request.GET.get("cursor") or None


def _page(page: feed.Page) -> JsonResponse:
    return JsonResponse(feed.page_as_dict(page))


def _group_or_404(slug: str, reader: Any) -> Group | HttpResponse:
    """The group of ``slug``, if the site lets ``reader`` read its timeline
    (PRESENCE_FEED["CAN_READ"]): a refusal is the 404 of a group that does not exist."""
    # Only a slug's characters reach the query (NUL would be a database error on PostgreSQL).
    group = None
    if SLUG.fullmatch(slug):
        group = Group.objects.filter(slug=slug).first()
        # Asked whether or not the group exists: a refused group costs what a missing one
        # does (the rule's queries), so the time of a 404 does not tell which groups exist.
        if not feed.may_read(reader, f"group:{slug}"):
            group = None
    if group is None:
        return error(
            "unknown_group", _("No group %(slug)s.") % {"slug": repr(slug[:60])}, status=404
        )
    return group


#: the values ``?include_self=`` takes
_FLAGS = {"0": False, "false": False, "1": True, "true": True}


@_feed_view("GET")
def following_view(request: HttpRequest) -> HttpResponse:
    """``GET ?cursor=&include_self=1``: ``{"activities": [ACTIVITY...], "next_cursor"}`` of
    the people the caller follows (``include_self``: and the caller's own, as a live
    ``following`` timeline sends them)."""
    flag = request.GET.get("include_self", "0")
    if flag not in _FLAGS:
        raise InvalidInput("invalid_value", _("'include_self' must be 0 or 1."))
    if not feed.may_read(request.user, "following"):
        return _no_timeline("following")
    page = feed.following_timeline(request.user, cursor=_cursor(request), include_self=_FLAGS[flag])
    return _page(page)


def _no_timeline(name: str) -> HttpResponse:
    """The site's rule (PRESENCE_FEED["CAN_READ"]) refuses the caller one of their own
    timelines: answered as watch_feed answers it."""
    return error("unknown_feed", _("No such timeline: %(feed)s.") % {"feed": name}, status=404)


@_feed_view("GET")
def mentions_view(request: HttpRequest) -> HttpResponse:
    if not feed.may_read(request.user, "mentions"):
        return _no_timeline("mentions")
    return _page(feed.mentions_timeline(request.user, cursor=_cursor(request)))


@_feed_view("GET")
def user_view(request: HttpRequest, user_id: str) -> HttpResponse:
    try:
        pk: Any = parse_user_id(user_id)  # Any: the site's pk type
    except ValueError:  # an id the pk cannot be names no user either
        return error("unknown_user", _("No user %(id)s.") % {"id": user_id[:60]}, status=404)
    # A timeline the site's rule refuses is answered as a user that does not exist; the rule
    # is asked whether or not the user exists, so a refusal costs what a missing user does.
    exists = get_user_model()._default_manager.filter(pk=pk).exists()
    allowed = feed.may_read(request.user, "user:" + feed.feed_key(pk))
    if not (exists and allowed):
        return error("unknown_user", _("No user %(id)s.") % {"id": pk}, status=404)
    return _page(feed.user_timeline(pk, request.user, cursor=_cursor(request)))


@_feed_view("GET")
def group_view(request: HttpRequest, slug: str) -> HttpResponse:
    group = _group_or_404(slug, request.user)
    if isinstance(group, HttpResponse):
        return group
    return _page(feed.group_timeline(group, request.user, cursor=_cursor(request)))


def _group_state(group: Group, user: Any) -> dict[str, Any]:
    return {
        "group": {
            "slug": group.slug,
            "name": group.name,
            "member": feed.is_member(user, group),
            "members": group.memberships.count(),
        }
    }


@_feed_view("POST", csrf=True)
def join_view(request: HttpRequest, slug: str) -> HttpResponse:
    """``POST``: join the group; answers ``{"group": {"slug", "name", "member", "members"}}``."""
    return _membership(request, slug, feed.join)


@_feed_view("POST", csrf=True)
def leave_view(request: HttpRequest, slug: str) -> HttpResponse:
    """``POST``: leave the group; answers as ``join_view`` does."""
    return _membership(request, slug, feed.leave)


def _membership(
    request: HttpRequest, slug: str, change: Callable[[Any, Any], object]
) -> HttpResponse:
    # A group whose timeline the site's rule refuses the caller (a private group, to a
    # non-member) cannot be joined here either: the site admits its members its own way.
    group = _group_or_404(slug, request.user)
    if isinstance(group, HttpResponse):
        return group
    limited = over_rate_limit(request)
    if limited is not None:
        return limited
    change(request.user, group)
    return JsonResponse(_group_state(group, request.user))


def max_post_bytes() -> int:
    # Each character may take up to 12 bytes as a JSON escape (a surrogate pair of \\uXXXX).
    return 12 * get_settings().ACTIVITY_MAX_LENGTH + 1024


@_feed_view("POST")
def post_view(request: HttpRequest) -> HttpResponse:
    """``POST`` a JSON object ``{"text": "..."}`` (CSRF-protected); answers 201
    ``{"activity": ACTIVITY}``."""
    data, refused = json_body(request, max_post_bytes())
    if refused is not None:
        return refused
    if not isinstance(data, dict):
        return error("invalid_message", _("Expected a JSON object."))
    if "text" not in data:
        return error("invalid_message", _("'text' is required."))
    # (checked before counting: a refused post saves nothing, so it is not a write)
    feed_domain.clean_text(data["text"], get_settings().ACTIVITY_MAX_LENGTH)
    refused = over_rate_limit(request)
    if refused is not None:
        return refused
    activity = feed.post(request.user, data["text"])
    return JsonResponse({"activity": feed.activity_as_dict(activity)}, status=201)


@_feed_view("GET")
def mention_suggestions_view(request: HttpRequest) -> HttpResponse:
    """``GET ?q=al``: ``{"users": [{"id", "username"}, ...]}``, usernames starting with ``q``
    (ignoring case), at most 10; users blocked either way are left out."""
    prefix = (request.GET.get("q") or "").strip().removeprefix("@")
    if not prefix:
        return JsonResponse({"users": []})
    if len(prefix) > MAX_PREFIX:
        return error("invalid_value", _("'q' is too long."))
    # NUL would reach the database (PostgreSQL refuses it in text: a 500).
    check_text(prefix, "q")
    users = feed.usernames_starting_with(prefix, request.user, MAX_SUGGESTIONS)
    return JsonResponse(
        {"users": [{"id": user.pk, "username": feed.handle_of(user)} for user in users]}
    )
