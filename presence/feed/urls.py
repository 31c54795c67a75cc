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
    # Any segment: the views answer an id or slug that cannot be one with a JSON 404, as every
    # other error (a converter refusing it would leave Django's HTML 404 page).
    path("api/feed/user/<str:user_id>", feed_views.user_view, name="feed-user"),
    path("api/feed/group/<str:slug>", feed_views.group_view, name="feed-group"),
    path("api/feed/group/<str:slug>/join", feed_views.join_view, name="feed-group-join"),
    path("api/feed/group/<str:slug>/leave", feed_views.leave_view, name="feed-group-leave"),
    path("api/feed/post", feed_views.post_view, name="feed-post"),
    path(
        "api/feed/mention-suggestions",
        feed_views.mention_suggestions_view,
        name="feed-mention-suggestions",
    ),
]
