from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("presence/", include("presence.urls")),
    path("presence/", include("presence.feed.urls")),
    # what the session tests post to (the demo's logout, without the demo)
    path("logout/", auth_views.LogoutView.as_view(next_page="/"), name="logout"),
]
