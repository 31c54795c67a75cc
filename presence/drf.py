"""Django REST framework: a serializer field embedding a user's presence, as the request's user
may see it (the one privacy resolver).

    from presence.drf import PresenceField

    class AuthorSerializer(serializers.ModelSerializer):
        presence = PresenceField(source="*")  # the object is a user

    class PostSerializer(serializers.ModelSerializer):
        author_presence = PresenceField(source="author_id")  # a user id, no query for it

Serializing a page (``many=True``) loads the presence of every user on it at once, on the first
field: one query and one Redis round trip for the page, never one per row. The request comes from
the serializer's context (``context={"request": request}``, which DRF's views pass); without
one, users are seen as a stranger sees them. Install with ``django-live-presence[drf]``.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from presence import api, domain
from presence.domain import UserId
from presence.users import user_pk

#: where the presence read for a request is kept (one read per page and request)
_CACHE_ATTR = "_presence_drf_cache"


class PresenceField(serializers.Field):
    """Read-only: ``{"status", "last_seen", "last_seen_approx", "devices", "text", "emoji",
    "activity"}`` (the JSON ``PRESENCE`` of the HTTP endpoints and the WebSocket), or the hidden
    presence."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> dict[str, Any]:
        pk = user_pk(value)
        request = self.context.get("request")
        cache = self._cache(request)
        if pk not in cache:
            ids = [pk, *self._page_ids()]
            found = api.bulk_presence(ids, getattr(request, "user", None))
            cache.update({uid: found.get(uid, domain.HIDDEN) for uid in ids})
        return cache[pk].as_dict()

    @staticmethod
    def _cache(request: Any) -> dict[UserId, domain.Presence]:
        if request is None:
            return {}
        cache = getattr(request, _CACHE_ATTR, None)
        if cache is None:
            cache = {}
            setattr(request, _CACHE_ATTR, cache)
        return cache

    def _page_ids(self) -> list[UserId]:
        """The users of every row of the list being serialized (``many=True``), if any."""
        rows = getattr(self.root, "instance", None)
        if rows is None or not isinstance(self.root, serializers.ListSerializer):
            return []
        ids = []
        for row in rows:
            try:
                ids.append(user_pk(self.get_attribute(row)))
            except (TypeError, AttributeError):
                continue
        return ids
