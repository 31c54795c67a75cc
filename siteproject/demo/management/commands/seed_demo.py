"""Create the demo's users, contacts, blocks, privacy settings, statuses, groups and posts.
Idempotent."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from presence import api
from presence.feed import api as feed
from presence.feed.models import Activity, Group, Mention
from presence.models import Block, Contact, LastSeen, PrivacySettings
from siteproject.demo import seed


def _ago(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


class Command(BaseCommand):
    help = (
        f"Create demo users (password {seed.DEMO_PASSWORD!r}), friends, a one-way follow, a close "
        "friend, a block, privacy variations, custom statuses and an admin superuser. "
        "Safe to run again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--online",
            nargs="+",
            metavar="USERNAME",
            default=[],
            help="Also record activity of these demo users now, so they show online for a few "
            "minutes (needs Redis).",
        )

    def handle(self, *args: Any, online: list[str], **options: Any) -> None:
        unknown = sorted(set(online) - set(seed.DEMO_USERS))
        if unknown:
            raise CommandError(f"Not demo users: {', '.join(unknown)}")
        with transaction.atomic():
            users = self._users()
            self._relations(users)
            self._groups(users)
            self._posts(users)
        # Statuses go through the API (it validates them and tells the live layer).
        for name, (status, text, emoji) in seed.STATUSES.items():
            api.set_status(users[name], status, text=text, emoji=emoji)
            self.stdout.write(f"status   {name}: {status} {emoji or ''} {text or ''}".rstrip())
        # Never moves a last seen backwards, so running again keeps real activity.
        now = time.time()
        LastSeen.objects.record_many(
            {users[name].pk: now - ago for name, ago in seed.LAST_SEEN_AGO.items()}
        )
        self.stdout.write(
            "last seen "
            + ", ".join(f"{name} {_ago(ago)} ago" for name, ago in seed.LAST_SEEN_AGO.items())
        )
        for name in online:
            api.touch(users[name])
            self.stdout.write(f"online   {name} (for the next few minutes)")
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo ready: log in as {', '.join(seed.DEMO_USERS)} or admin, "
                f"password {seed.DEMO_PASSWORD!r}."
            )
        )

    def _users(self) -> dict[str, Any]:
        user_model = get_user_model()
        users: dict[str, Any] = {}
        for name, (first, last) in seed.DEMO_USERS.items():
            user, created = user_model._default_manager.get_or_create(
                username=name,
                defaults={"first_name": first, "last_name": last, "email": f"{name}@example.com"},
            )
            _give_demo_password(user)
            users[name] = user
            self.stdout.write(f"user     {name} ({'created' if created else 'exists'})")
        admin, created = user_model._default_manager.get_or_create(
            username="admin", defaults={"email": "admin@example.com"}
        )
        admin.is_staff = admin.is_superuser = True
        _give_demo_password(admin)
        self.stdout.write(f"superuser admin ({'created' if created else 'exists'})")
        return users

    def _relations(self, users: dict[str, Any]) -> None:
        def follow(owner: str, contact: str) -> None:
            Contact.objects.get_or_create(owner=users[owner], contact=users[contact])

        for a, b in seed.FRIENDS:
            follow(a, b)
            follow(b, a)
            self.stdout.write(f"friends  {a} <-> {b}")
        for a, b in seed.FOLLOWS:
            follow(a, b)
            self.stdout.write(f"follows  {a} -> {b}")
        for owner, contact in seed.CLOSE_FRIENDS:
            Contact.objects.update_or_create(
                owner=users[owner], contact=users[contact], defaults={"close_friend": True}
            )
            self.stdout.write(f"close    {owner} marked {contact} a close friend")
        for blocker, blocked in seed.BLOCKS:
            Block.objects.get_or_create(blocker=users[blocker], blocked=users[blocked])
            self.stdout.write(f"block    {blocker} blocked {blocked}")
        for name, fields in seed.PRIVACY.items():
            PrivacySettings.objects.update_or_create(user=users[name], defaults=fields)
            shown = ", ".join(f"{key}={value}" for key, value in fields.items())
            self.stdout.write(f"privacy  {name}: {shown}")

    def _groups(self, users: dict[str, Any]) -> None:
        for slug, (name, description, members) in seed.GROUPS.items():
            group, _ = Group.objects.update_or_create(
                slug=slug, defaults={"name": name, "description": description}
            )
            for member in members:
                feed.join(users[member], group)
            self.stdout.write(f"group    {name}: {', '.join(members)}")

    def _posts(self, users: dict[str, Any]) -> None:
        now = timezone.now()
        for author, text, minutes_ago in seed.POSTS:
            if Activity.objects.filter(author=users[author], text=text).exists():
                continue
            # Through the feed, which parses the mentions; then dated as the seed says.
            activity = feed.post(users[author], text)
            when = now - timedelta(minutes=minutes_ago)
            Activity.objects.filter(pk=activity.pk).update(created_at=when)
            Mention.objects.filter(activity=activity).update(created_at=when)
            self.stdout.write(f"post     {author}: {text}")


def _give_demo_password(user: Any) -> None:
    """The printed password works after every run; one that works already is left alone: a new
    hash (a new salt) would end the user's sessions, and with them their open sockets."""
    if not user.check_password(seed.DEMO_PASSWORD):
        user.set_password(seed.DEMO_PASSWORD)
    user.save()
