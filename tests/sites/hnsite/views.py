from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from tests.sites.hnsite.models import Story


def news(request: HttpRequest) -> HttpResponse:
    stories = Story.objects.select_related("author").order_by("pk")
    return render(request, "hn/news.html", {"stories": stories})
