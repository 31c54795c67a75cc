"""The forum's pages: categories, a category's topics, a topic with its comments (a private one
for its participants only), the user list. presence is in the templates, and in
remove_participant (recheck_room)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from presence import api
from tests.sites.forumsite.models import Category, Topic


def index(request: HttpRequest) -> HttpResponse:
    return render(request, "forum/index.html", {"categories": Category.objects.order_by("pk")})


def category(request: HttpRequest, slug: str) -> HttpResponse:
    found = get_object_or_404(Category, slug=slug)
    topics = found.topics.filter(is_private=False).select_related("user").order_by("pk")
    return render(request, "forum/category.html", {"category": found, "topics": topics})


def topic(request: HttpRequest, pk: int) -> HttpResponse:
    found = get_object_or_404(Topic.objects.select_related("category"), pk=pk)
    if not found.can_be_read_by(request.user):
        raise PermissionDenied
    comments = found.comments.order_by("pk")  # the authors: presence_prefetch's path loads them
    return render(request, "forum/topic.html", {"topic": found, "comments": comments})


@require_POST
@login_required
def remove_participant(request: HttpRequest, pk: int, user_pk: int) -> HttpResponse:
    """The topic's author takes someone out of a private topic: their open page of it stops
    showing who is there at once (docs/rooms.md, "When access is taken away")."""
    found = get_object_or_404(Topic, pk=pk, is_private=True, user=request.user)
    removed = get_object_or_404(found.participants, pk=user_pk)
    found.participants.remove(removed)
    api.recheck_room(("topic", found.pk), users=[removed])
    return redirect("topic", pk=found.pk)


@login_required
def private_topics(request: HttpRequest) -> HttpResponse:
    topics = Topic.objects.filter(is_private=True, participants=request.user).order_by("pk")
    return render(request, "forum/private.html", {"topics": topics})


def users(request: HttpRequest) -> HttpResponse:
    people = get_user_model().objects.filter(is_active=True).order_by("username")
    return render(request, "forum/users.html", {"people": people})
