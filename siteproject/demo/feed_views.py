"""The demo's activity feed pages: the four timelines, posting, groups.

Everything goes through ``presence.feed`` (timelines, posting, joining) and presence's template
tags (dots): privacy is applied there, so these views only choose what to show.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db.models import Count, Exists, OuterRef
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from presence import rendering
from presence.feed import api as feed
from presence.feed.conf import get_settings
from presence.feed.models import Activity, Group, Membership
from siteproject.demo.feed_forms import PostForm
from siteproject.demo.views import (
    _back,
    member_view,
    over_write_limit,
    rate_limited_action,
    rate_limited_page,
    refuse_bad_text,
)

User = get_user_model()

#: most members whose presence a group page reads (one query and one Redis round trip)
ONLINE_MEMBERS_READ = 500


def _timeline(request: HttpRequest, load: Any, first_page: str) -> feed.Page | HttpResponse:
    """One page of a timeline at ``?cursor=``; a bad cursor goes back to the first page."""
    try:
        return load(request.GET.get("cursor") or None)  # type: ignore[no-any-return]
    except feed.InvalidInput as error:
        messages.error(request, error.message)
        return redirect(first_page)


def _context(request: HttpRequest, page: feed.Page, **extra: Any) -> dict[str, Any]:
    authors = list({activity.author_id: activity.author for activity in page.activities}.values())
    return {
        "page": page,
        "cursor": request.GET.get("cursor") or "",
        "page_users": [request.user, *authors, *extra.pop("page_users", [])],
        **extra,
    }


@member_view
def following(request: HttpRequest) -> HttpResponse:
    """The people I follow, and me, newest first; with the post box."""
    me = request.user
    form = PostForm(request.POST or None)
    wait = None
    if request.method == "POST" and form.is_valid():
        wait = over_write_limit(me, form, "text")
        if wait is None:
            try:
                feed.post(me, form.cleaned_data["text"])
            except feed.InvalidInput as error:
                form.add_error("text", error.message)
            else:
                messages.success(request, _("Posted."))
                return redirect("demo:feed")
    page = _timeline(
        request,
        lambda cursor: feed.following_timeline(me, cursor=cursor, include_self=True),
        "demo:feed",
    )
    if isinstance(page, HttpResponse):
        return page
    context = _context(
        request,
        page,
        form=form,
        tab="following",
        live_feed="following",
        text_max=get_settings().ACTIVITY_MAX_LENGTH,
    )
    response = render(request, "demo/feed.html", context)
    return response if wait is None else rate_limited_page(response, wait)


@member_view
def mentions(request: HttpRequest) -> HttpResponse:
    me = request.user
    page = _timeline(
        request, lambda cursor: feed.mentions_timeline(me, cursor=cursor), "demo:feed_mentions"
    )
    if isinstance(page, HttpResponse):
        return page
    return render(
        request, "demo/feed.html", _context(request, page, tab="mentions", live_feed="mentions")
    )


@member_view
def user_activity(request: HttpRequest, username: str) -> HttpResponse:
    refused = refuse_bad_text(username, "username")
    if refused is not None:
        return refused
    target = get_object_or_404(User, username=username)
    page = _timeline(
        request,
        lambda cursor: feed.user_timeline(target, request.user, cursor=cursor),
        reverse("demo:user_feed", args=[username]),
    )
    if isinstance(page, HttpResponse):
        return page
    context = _context(
        request, page, target=target, page_users=[target], live_feed=f"user:{target.pk}"
    )
    return render(request, "demo/user_feed.html", context)


@member_view
def post(request: HttpRequest, pk: int) -> HttpResponse:
    """One post, with who is reading it now (the room ``post:<pk>``, docs/rooms.md); a post the
    viewer may not see is a 404, as if it did not exist."""
    activity = get_object_or_404(Activity.objects.select_related("author"), pk=pk)
    if not feed.can_see(request.user, activity):
        raise Http404("No such post.")
    context = {"activity": activity, "page_users": [request.user, activity.author]}
    return render(request, "demo/post.html", context)


@member_view
def groups(request: HttpRequest) -> HttpResponse:
    me = request.user
    listed = Group.objects.annotate(
        member_count=Count("memberships"),
        is_member=Exists(Membership.objects.filter(group=OuterRef("pk"), user=me)),
    ).order_by("name", "pk")
    return render(request, "demo/groups.html", {"groups": list(listed), "page_users": [me]})


@member_view
def group(request: HttpRequest, slug: str) -> HttpResponse:
    me = request.user
    found = get_object_or_404(Group, slug=slug)
    page = _timeline(
        request,
        lambda cursor: feed.group_timeline(found, me, cursor=cursor),
        reverse("demo:group", args=[slug]),
    )
    if isinstance(page, HttpResponse):
        return page
    members = list(
        User._default_manager.filter(presence_memberships__group=found).order_by(
            "first_name", "username"
        )[:ONLINE_MEMBERS_READ]
    )
    # One query and one Redis round trip for every member's dot; privacy applies (a member
    # hiding their online status, or blocked either way, is not listed).
    rendering.prefetch(request, members)
    online = [m for m in members if rendering.presence_for(request, m)[1].is_online]
    context = _context(
        request,
        page,
        group=found,
        is_member=any(m.pk == me.pk for m in members) or feed.is_member(me, found),
        member_count=found.memberships.count(),
        online=online,
        live_feed=f"group:{found.slug}",
    )
    return render(request, "demo/group.html", context)


@member_view
@require_POST
def group_action(request: HttpRequest, slug: str, action: str) -> HttpResponse:
    found = get_object_or_404(Group, slug=slug)
    if action not in ("join", "leave"):
        raise Http404("Unknown action.")
    limited = rate_limited_action(request.user)
    if limited is not None:
        return limited
    if action == "join":
        feed.join(request.user, found)
        messages.success(request, _("You joined %(group)s.") % {"group": found.name})
    else:
        feed.leave(request.user, found)
        messages.success(request, _("You left %(group)s.") % {"group": found.name})
    return _back(request, reverse("demo:group", args=[slug]))
