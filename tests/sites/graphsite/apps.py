from __future__ import annotations

from django.apps import AppConfig


class GraphsiteConfig(AppConfig):
    name = "tests.sites.graphsite"
    label = "graphsite"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tests.sites.graphsite import receivers  # noqa: F401  (connects them)
