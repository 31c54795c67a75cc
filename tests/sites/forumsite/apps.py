from __future__ import annotations

from django.apps import AppConfig


class ForumsiteConfig(AppConfig):
    name = "tests.sites.forumsite"
    label = "forumsite"
    default_auto_field = "django.db.models.BigAutoField"
