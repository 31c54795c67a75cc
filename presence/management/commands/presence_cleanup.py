from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from presence import api
from presence.api import CleanupIncomplete, CleanupReport
from presence.store import StoreUnavailable


class Command(BaseCommand):
    help = (
        "Persist last seen of users who are no longer online to the database, then remove them "
        "from Redis in small batches. Safe to run while the site is live, and twice at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Only count what would be persisted and removed.",
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=None,
            help="Redis buckets read per round trip (default: PRESENCE['CLEANUP_BATCH']).",
        )

    def handle(self, *args: Any, dry_run: bool, batch: int | None, **options: Any) -> None:
        if batch is not None and batch < 1:
            raise CommandError("--batch must be a positive number.")
        try:
            report = api.cleanup(dry_run=dry_run, batch=batch)
        except CleanupIncomplete as exc:
            # A cluster master was unavailable: what the others hold was done (said), and the
            # exit status says the rest was not.
            self._say(exc.report, done=False)
            raise CommandError(
                f"{str(exc).rstrip('.')}. Run it again when every master answers."
            ) from exc
        except StoreUnavailable as exc:
            # Each batch is persisted before it is removed, so stopping half-way loses nothing.
            # The reason may end with its own period (redis-py's "... Connection refused.").
            reason = str(exc).rstrip(".")
            raise CommandError(
                f"{reason}. Cleanup stopped; entries leave Redis only after their last seen is "
                "saved, so nothing was lost. Run it again when Redis answers."
            ) from exc
        self._say(report, done=True)

    def _say(self, report: CleanupReport, done: bool) -> None:
        if report.dry_run:
            self.stdout.write(
                f"Dry run: {report.stale} stale entries in {report.buckets} buckets would be "
                f"persisted and removed; {report.expired_statuses} expired custom statuses "
                "would be cleared."
            )
            return
        said = (
            f"Scanned {report.buckets} buckets: {report.stale} stale entries, "
            f"{report.persisted} last seen times persisted, {report.removed} removed "
            f"from Redis; {report.expired_statuses} expired custom statuses cleared; "
            f"{report.room_members} room members whose stay ended removed from "
            f"{report.rooms} rooms ({report.rooms_emptied} rooms left empty, their "
            "keys removed)."
        )
        self.stdout.write(self.style.SUCCESS(said) if done else said)
