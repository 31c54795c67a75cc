from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from tests.sites.hnsite import views

urlpatterns = [
    path("", views.news, name="news"),
    path("admin/", admin.site.urls),
    path("presence/", include("presence.urls")),
]
