from __future__ import annotations

from django.apps import AppConfig


class EmailsiteConfig(AppConfig):
    name = "tests.sites.emailsite"
    label = "emailsite"
    default_auto_field = "django.db.models.BigAutoField"
