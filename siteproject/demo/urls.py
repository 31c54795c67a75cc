from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy
from django.utils.text import format_lazy
from django.views.generic import RedirectView
from django.views.i18n import set_language

from siteproject.demo import feed_views, views

app_name = "demo"

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="demo:login"), name="logout"),
    path("people/", views.people, name="people"),
    path("people/<int:pk>/<slug:action>/", views.relation_action, name="relation"),
    path("u/<str:username>/", views.profile, name="profile"),
    # The privacy page is presence's own (presence:settings), in the demo's layout
    # (templates/presence/base.html); the old address leads there.
    path(
        "settings/privacy/",
        RedirectView.as_view(pattern_name="presence:settings"),
        name="privacy",
    ),
    # So is the status, by presence's one form that decides its choices (presence.pages.forms,
    # also the header's {% presence_status_menu %}): the old address leads to its section.
    path(
        "settings/status/",
        RedirectView.as_view(
            url=format_lazy("{}#presence-settings-status", reverse_lazy("presence:settings"))
        ),
        name="status",
    ),
    # The activity feed (siteproject/demo/feed_views.py).
    path("feed/", feed_views.following, name="feed"),
    path("feed/mentions/", feed_views.mentions, name="feed_mentions"),
    path("u/<str:username>/activity/", feed_views.user_activity, name="user_feed"),
    path("posts/<int:pk>/", feed_views.post, name="post"),
    path("groups/", feed_views.groups, name="groups"),
    path("groups/<slug:slug>/", feed_views.group, name="group"),
    path("groups/<slug:slug>/<slug:action>/", feed_views.group_action, name="group_action"),
    # Here rather than in the root urls, so the demo is complete wherever it is included.
    path("i18n/setlang/", set_language, name="set_language"),
]
