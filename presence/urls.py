from __future__ import annotations

from django.urls import path

from presence import feed_views, views

app_name = "presence"

urlpatterns = [
    path("api/presence", views.presence_view, name="presence"),
    path("api/status", views.status_view, name="status"),
    # The activity feed (presence.feed_views).
    path("api/feed/following", feed_views.following_view, name="feed-following"),
    path("api/feed/mentions", feed_views.mentions_view, name="feed-mentions"),
    path("api/feed/user/<int:user_id>", feed_views.user_view, name="feed-user"),
    path("api/feed/group/<slug:slug>", feed_views.group_view, name="feed-group"),
    path("api/feed/group/<slug:slug>/join", feed_views.join_view, name="feed-group-join"),
    path("api/feed/group/<slug:slug>/leave", feed_views.leave_view, name="feed-group-leave"),
    path("api/feed/post", feed_views.post_view, name="feed-post"),
    path(
        "api/feed/mention-suggestions",
        feed_views.mention_suggestions_view,
        name="feed-mention-suggestions",
    ),
]
