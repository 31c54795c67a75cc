from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("presence/", include("presence.urls")),
    path("presence/", include("presence.feed.urls")),
]
