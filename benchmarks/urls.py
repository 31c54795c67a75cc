"""One small authenticated page, like a typical page of a social site, for the middleware run."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path


@login_required
def page(request: HttpRequest) -> HttpResponse:
    # The template uses request.user, so the user is loaded whether or not presence's middleware
    # runs: the comparison measures the middleware, not a lazy user load it would trigger.
    items = [f"Post {n}" for n in range(20)]
    return render(request, "benchmarks/page.html", {"items": items})


urlpatterns = [path("page/", page, name="bench-page")]
