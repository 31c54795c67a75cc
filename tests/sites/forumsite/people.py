"""The forum's people and topics for its tests (tests/sites/test_forumsite*.py): avatars are
real image files in the test's MEDIA_ROOT."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile

from tests.sites.forumsite.models import Category, Comment, Topic


def png(rgb: tuple[int, int, int] = (40, 120, 200)) -> bytes:
    """A one-pixel PNG of one colour (a real image a browser decodes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" + bytes(rgb))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def member(username: str, full_name: str = "", avatar: bool = True) -> Any:
    first, _, last = full_name.partition(" ")
    user = get_user_model().objects.create_user(
        username, password="pw", first_name=first, last_name=last
    )
    if avatar:
        user.avatar.save(f"{username}.png", ContentFile(png()), save=True)
    return user


def forum() -> dict[str, Any]:
    """ann and ben talk in a private topic; cy is a member who is not in it; dee has no avatar.
    A public topic in "General" has a comment of each."""
    ann, ben = member("ann", "Ann Smith"), member("ben", "Ben Ito")
    cy, dee = member("cy", "Cy Young"), member("dee", avatar=False)
    general = Category.objects.create(title="General", slug="general")
    public = Topic.objects.create(category=general, user=ann, title="Welcome")
    for author in (ann, ben, cy, dee):
        Comment.objects.create(topic=public, user=author, text=f"hello from {author.username}")
    private = Topic.objects.create(category=general, user=ann, title="Plans", is_private=True)
    private.participants.set([ann, ben])
    Comment.objects.create(topic=private, user=ann, text="just us")
    return {
        "ann": ann,
        "ben": ben,
        "cy": cy,
        "dee": dee,
        "general": general,
        "public": public,
        "private": private,
    }
