"""The forum's pages: categories, a category's topics, a topic with its comments (a private one
for its participants only), the user list. Nothing here is presence's: the templates are."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from tests.forumsite.models import Category, Topic


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


@login_required
def private_topics(request: HttpRequest) -> HttpResponse:
    topics = Topic.objects.filter(is_private=True, participants=request.user).order_by("pk")
    return render(request, "forum/private.html", {"topics": topics})


def users(request: HttpRequest) -> HttpResponse:
    people = get_user_model().objects.filter(is_active=True).order_by("username")
    return render(request, "forum/users.html", {"people": people})
