"""The activity feed's JSON endpoints: ``path("presence/", include("presence.feed.urls"))`` next
to presence's own gives ``presence/api/feed/...``. Names are reversed as
``presence_feed:feed-post`` etc."""

from __future__ import annotations

from django.urls import path

from presence.feed import views as feed_views

app_name = "presence_feed"

urlpatterns = [
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
