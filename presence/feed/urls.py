"""The activity feed's JSON endpoints: ``path("presence/", include("presence.feed.urls"))`` next
to presence's own gives ``presence/api/feed/...``. Names are reversed as
``presence_feed:feed-post`` etc."""

from __future__ import annotations

from typing import Any

from django.urls import path, register_converter

from presence.feed import views as feed_views
from presence.users import parse_user_id


class UserIdConverter:
    """A user id in a URL as the site spells its pk (``7``, a UUID): anything else is a 404."""

    regex = r"[^/]{1,255}"

    def to_python(self, value: str) -> Any:
        return parse_user_id(value)  # ValueError: no match

    def to_url(self, value: Any) -> str:
        return str(value)


register_converter(UserIdConverter, "presence_user_id")

app_name = "presence_feed"

urlpatterns = [
    path("api/feed/following", feed_views.following_view, name="feed-following"),
    path("api/feed/mentions", feed_views.mentions_view, name="feed-mentions"),
    path("api/feed/user/<presence_user_id:user_id>", feed_views.user_view, name="feed-user"),
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
