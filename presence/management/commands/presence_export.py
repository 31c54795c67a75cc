from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from presence import api, extensions
from presence.store import StoreUnavailable
from presence.users import parse_user_id


def find_user(value: str) -> Any:
    """The user whose pk is ``value``, else whose username (USERNAME_FIELD) is."""
    model = get_user_model()
    try:
        pk: Any = parse_user_id(value)
        return model._default_manager.get(pk=pk)
    except (ValueError, model.DoesNotExist):
        pass
    try:
        return model._default_manager.get_by_natural_key(value)
    except model.DoesNotExist:
        raise CommandError(f"No user has the pk or the username {value!r}.") from None


class Command(BaseCommand):
    help = (
        "Print everything presence holds about one user (database rows and what Redis holds) "
        "as JSON, for a data request (api.export_user_data), with the parts installed apps "
        'add (the activity feed\'s, under "feed").'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="the user's pk or username")

    def handle(self, *args: Any, user: str, **options: Any) -> None:
        found = find_user(user)
        try:
            data = api.export_user_data(found)
        except StoreUnavailable as exc:
            reason = str(exc).rstrip(".")
            raise CommandError(f"{reason}. Nothing was exported; try again.") from exc
        # The apps' parts (presence.feed's "feed"): the core knows none of them by name.
        for key, export in extensions.export_parts().items():
            data[key] = export(found)
        self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
