"""Django REST framework: a serializer field embedding a user's presence, as the request's user
may see it (the one privacy resolver).

    from presence.drf import PresenceField

    class AuthorSerializer(serializers.ModelSerializer):
        presence = PresenceField(source="*")  # the object is a user

    class PostSerializer(serializers.ModelSerializer):
        author_presence = PresenceField(source="author_id")  # a user id, no query for it

Serializing a page (``many=True``) loads the presence of every user on it at once, on the first
field: one query and one Redis round trip for the page, never one per row; also where the field
sits in a nested serializer (a post's ``author = AuthorSerializer()``, a group's
``members = MemberSerializer(many=True)``). The request comes from the serializer's context
(``context={"request": request}``, which DRF's views pass); without one, users are seen as a
stranger sees them. Install with ``django-live-presence[drf]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Manager
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

    def _cache(self, request: Any) -> dict[UserId, domain.Presence]:
        """The presences read for this request (or, without one, for this serialization:
        kept on the outermost serializer)."""
        holder = self.root if request is None else request
        cache = getattr(holder, _CACHE_ATTR, None)
        if cache is None:
            cache = {}
            setattr(holder, _CACHE_ATTR, cache)
        return cache

    def _page_ids(self) -> list[UserId]:
        """The users this field will show for every row being serialized: the outermost
        serializer's instance (a page, or one object with nested lists), followed down through
        the nested serializers to this field's source."""
        path: list[serializers.Field] = []
        node: Any = self
        while node is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        root = path[0]
        if root is self or getattr(root, "instance", None) is None:
            return []
        ids: list[UserId] = []
        try:
            values = (
                _each(root.instance)
                if isinstance(root, serializers.ListSerializer)
                else [root.instance]
            )
            for node, parent in zip(path[1:], path, strict=False):
                if isinstance(parent, serializers.ListSerializer) and node is parent.child:
                    continue  # (a list's child serializes each item itself)
                got = (node.get_attribute(value) for value in values)
                if isinstance(node, serializers.ListSerializer):
                    values = [item for many in got if many is not None for item in _each(many)]
                elif node is self:
                    ids = [user_pk(value) for value in got if value is not None]
                else:
                    values = [value for value in got if value is not None]
        except Exception:  # (a row this cannot follow: that row's field reads on its own)
            return ids
        return ids


def _each(many: Any) -> Iterable[Any]:
    """A nested list's items, as DRF's ListSerializer iterates them (a related manager's
    ``all()``)."""
    return many.all() if isinstance(many, Manager) else many
