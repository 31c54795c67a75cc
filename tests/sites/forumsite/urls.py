from __future__ import annotations

from django.conf import settings
from django.conf.urls.static import static
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from tests.sites.forumsite import views

urlpatterns = [
    path("", views.index, name="index"),
    path("c/<slug:slug>/", views.category, name="category"),
    path("t/<int:pk>/", views.topic, name="topic"),
    path(
        "t/<int:pk>/participants/<int:user_pk>/remove/",
        views.remove_participant,
        name="remove_participant",
    ),
    path("private/", views.private_topics, name="private"),
    path("users/", views.users, name="users"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("presence/", include("presence.urls")),  # README, "Wiring it into a site"
    *static(settings.MEDIA_URL, document_root=settings.MEDIA_ROOT),  # avatars, with DEBUG on
]
