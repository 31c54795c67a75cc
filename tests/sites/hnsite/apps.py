from __future__ import annotations

from django.apps import AppConfig


class HnsiteConfig(AppConfig):
    name = "tests.sites.hnsite"
    label = "hnsite"
    default_auto_field = "django.db.models.BigAutoField"
