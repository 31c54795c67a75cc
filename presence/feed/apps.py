from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class FeedConfig(AppConfig):
    name = "presence.feed"
    label = "presence_feed"
    verbose_name = _("Activity feed")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from presence import extensions
        from presence.feed import api, checks, live, receivers  # noqa: F401  (registers checks)

        # Custom status text changes become activities when RECORD_STATUS_ACTIVITIES is on.
        receivers.connect()
        # watch_feed/unwatch_feed frames and live delivery, through presence's extension points.
        live.register()
        # The feed's part of a user's data in manage.py presence_export ("feed").
        extensions.register_export("feed", api.export_user_data)
