from __future__ import annotations

from django.urls import path

from presence import monitoring, views
from presence.pages.views import settings_view

app_name = "presence"

urlpatterns = [
    path("api/presence", views.presence_view, name="presence"),
    path("api/status", views.status_view, name="status"),
    # no login: the count presence.js polls where it has no socket (docs/http.md)
    path("api/online_count", views.online_count_view, name="online_count"),
    # load balancers and probes: no login, no database (docs/operations.md)
    path("api/health", monitoring.health_view, name="health"),
    # many rooms' counts in one read, what presence.js polls without a socket (docs/http.md)
    path("api/room_counts", views.room_counts_view, name="room_counts"),
    # <path:>: a room's id may hold a "/" (docs/rooms.md)
    path("api/rooms/<path:room>", views.room_view, name="room"),
    # the ready privacy and status page a site links to (docs/privacy.md)
    path("settings/", settings_view, name="settings"),
]
