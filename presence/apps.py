from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PresenceConfig(AppConfig):
    name = "presence"
    verbose_name = _("Presence")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from presence import (  # noqa: F401  (checks register on import)
            checks,
            database_checks,
            monitoring,
            receivers,
        )

        receivers.connect()
        monitoring.connect()
