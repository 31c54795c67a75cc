from __future__ import annotations

from django.apps import AppConfig


class UuidsiteConfig(AppConfig):
    name = "tests.sites.uuidsite"
    label = "uuidsite"
    default_auto_field = "django.db.models.BigAutoField"
